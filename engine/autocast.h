// Mixed precision by autocasting, PyTorch's policy: under an AutocastGuard(f16 or bf16), the
// GEMM-heavy ops (conv2d, linear, matmul) cast their f32 inputs, activations and weights alike, to
// the low dtype with the ordinary differentiable cast (Tensor::to) and compute in it. Their output
// stays in the low dtype where the device's backend runs the ops between matrix ops in it
// (BackendImpl::keeps_low_precision_activations: batch norm, activations, pooling, elementwise
// maths, softmax, concatenation), so a CNN's activations are 16-bit from one convolution to the
// next and move half the bytes; elsewhere it is cast back to f32. Ops that mix a 16-bit and an f32
// tensor (a residual add onto an f32 stream, a bias or scale parameter) promote to f32, as PyTorch's
// type promotion does. Losses, layer norm and the reductions compute in f32 whatever they are
// given (a 16-bit input is cast up, the result rounded once where it is an activation).
//
// Why this split: convolutions and matrix products are where nearly all the FLOPs are, and they
// are what tensor cores (and oneDNN's avx512_bf16 and AMX kernels) speed up 2-16x; their
// accumulation stays f32 inside cuDNN/cuBLAS/oneDNN, so only the rounding of inputs and output to 8
// (bf16) or 11 (f16) mantissa bits is lost. The ops between them are memory-bound: in 16 bits they
// read and write half the bytes, and they compute in f32 inside (batch norm's statistics are f32
// sums, its parameters and running statistics stay f32). Losses and reductions over many elements
// stay f32, where bf16's precision or f16's range (max 65504) would hurt. Because the casts are
// ordinary autograd ops, gradients reach the f32 master weights in f32: the weight's cast node turns
// the low-precision gradient back into f32, and the optimizer updates f32 weights, so small updates
// are not rounded away.
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
// The output y (in the low dtype) of a GEMM-heavy op under autocast: y itself where the backend of
// y's device keeps low-precision activations, else y cast back to f32.
Tensor autocast_output(const Tensor& y);
}  // namespace detail

}  // namespace duet
