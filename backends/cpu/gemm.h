// One matrix product on oneDNN's matmul primitive, for ops of the cpu backend that reduce to a
// GEMM (linear layers, matmul.cpp; pointwise convolutions on small maps, conv.cpp). Each operand
// is a 2-D view of a tensor's memory: element (i, j) at data[i * row + j * col], so a transposed
// operand is the same memory with its two strides swapped and needs no copy.
#pragma once
#include <cstdint>
#include <optional>
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet::cpu {

struct MatrixOperand {
  const Tensor& t;  // its dtype and its first element; rows x cols elements are read through the strides
  int64_t rows, cols, row, col;
  int64_t batch_stride = 0;  // elements between the matrices of a batched product (gemm_batched)
};

// What the product does to each tile of c before storing it (oneDNN post-ops): adds c's old
// contents when `accumulate` (c += a @ b: a sum over blocks of the inner dimension, one product per
// block), adds `residual`, a matrix of c's shape in any strides, then applies `act` (relu or relu6).
struct GemmEpilogue {
  const MatrixOperand* residual = nullptr;
  std::optional<Activation> act;
  bool accumulate = false;
};

// c = a @ b, plus bias[j] on every row when bias is defined (a vector of c.cols elements, any
// stride), then the epilogue. The primitive is cached per shape, strides and dtypes; bf16
// operands accumulate in f32 and c may be bf16 or f32. A frozen b (an inference model's weights:
// Tensor::freeze) is packed once into the layout the kernel reads and the packed copy kept
// (engine/frozen_copies.h); any other b is read as it lies, which oneDNN's brgemm kernel packs
// again at every call. `op` names the caller in error messages; the profiler reports the
// implementation as "matmul/<oneDNN's kernel>".
void gemm(const char* op, const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c,
          const Tensor& bias = Tensor(), const GemmEpilogue& epilogue = {});
// c[i] = a[i] @ b[i] for i < batch, each operand's i-th matrix batch_stride elements after the last,
// then the epilogue.
void gemm_batched(const char* op, int64_t batch, const MatrixOperand& a, const MatrixOperand& b,
                  const MatrixOperand& c, const GemmEpilogue& epilogue = {});

}  // namespace duet::cpu
