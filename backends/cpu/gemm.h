// One matrix product on oneDNN's matmul primitive, for ops of the cpu backend that reduce to a
// GEMM (linear layers, matmul.cpp; pointwise convolutions on small maps, conv.cpp). Each operand
// is a 2-D view of a tensor's memory: element (i, j) at data[i * row + j * col], so a transposed
// operand is the same memory with its two strides swapped and needs no copy.
#pragma once
#include <cstdint>
#include "engine/tensor.h"

namespace duet::cpu {

struct MatrixOperand {
  const Tensor& t;  // its dtype and its first element; rows x cols elements are read through the strides
  int64_t rows, cols, row, col;
  int64_t batch_stride = 0;  // elements between the matrices of a batched product (gemm_batched)
};

// c = a @ b, plus bias[j] on every row when bias is defined (a vector of c.cols elements, any
// stride), then max(0, .) when relu. The primitive is cached per shape, strides and dtypes; bf16
// operands accumulate in f32 and c may be bf16 or f32. `op` names the caller in error messages;
// the profiler reports the implementation as "matmul/<oneDNN's kernel>".
void gemm(const char* op, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
          bool relu);
// c[i] = a[i] @ b[i] for i < batch, each operand's i-th matrix batch_stride elements after the last.
void gemm_batched(const char* op, int64_t batch, const MatrixOperand& a, const MatrixOperand& b,
                  const MatrixOperand& c);

}  // namespace duet::cpu
