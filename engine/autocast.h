// Mixed precision by autocasting, PyTorch's simple policy: under an AutocastGuard(f16 or bf16),
// the GEMM-heavy ops (conv2d, linear, matmul) cast their f32 inputs, activations and weights alike,
// to the low dtype with the ordinary differentiable cast (Tensor::to), compute in it and cast the
// result back to f32. Every other op (batch/layer norm, softmax, losses, elementwise maths,
// reductions) sees only f32 tensors and stays in f32.
//
// Why this split: convolutions and matrix products are where nearly all the FLOPs are, and they
// are what tensor cores (and oneDNN's avx512_bf16 kernels) speed up 2-16x; their accumulation stays
// f32 inside cuDNN/cuBLAS/oneDNN, so only the rounding of inputs and output to 8 (bf16) or 11 (f16)
// mantissa bits is lost. Norms, softmax and losses reduce over many elements or exponentiate,
// where the low dtypes' precision (bf16) or range (f16, max 65504) would hurt, and they are
// memory-bound, so a low dtype would save little. Casting the output back to f32 keeps the rest of
// the network unaware of autocast. Because the casts are ordinary autograd ops, gradients reach the
// f32 master weights in f32: the weight's cast node turns the low-precision gradient back into f32,
// and the optimizer updates f32 weights, so small updates are not rounded away.
//
// Casts are recorded by the profiler as their own ops ("cast"), so their time and bytes show.
// f64 tensors are never cast (gradient checks stay exact), and tensors already in f16/bf16 pass.
// The state is per thread, like grad mode.
#pragma once
#include <initializer_list>
#include <optional>
#include "engine/dtype.h"

namespace duet {

class Tensor;

// The low dtype ops autocast to on this thread, or nullopt when autocast is off.
std::optional<DType> autocast_dtype();

class AutocastGuard {
public:
  // low must be f16 or bf16 (duet::Error otherwise). Nests: the innermost guard wins.
  explicit AutocastGuard(DType low);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

private:
  std::optional<DType> prev_;
};

namespace detail {
// The dtype a GEMM-heavy front-end should compute in: autocast's low dtype when autocast is on and
// one of the (defined) inputs is f32 (those are the ones that get cast); nullopt otherwise.
std::optional<DType> autocast_target(std::initializer_list<const Tensor*> inputs);
// t cast to `low` when it is f32 (differentiably), else t itself (undefined stays undefined).
Tensor autocast_input(const Tensor& t, DType low);
}  // namespace detail

}  // namespace duet
