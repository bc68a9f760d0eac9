// A convolution's epilogue (engine/ops.def's conv2d: y = act(conv(x) + bias + residual)) as its own
// passes over y, for a backend or an algorithm that cannot apply it inside the convolution's kernel
// (the reference backend, CUDA, duet's own depthwise kernel, a oneDNN primitive whose output is
// reordered after it). One place, so every path computes the same thing in the same order: the
// residual is added first, the activation applied to the sum.
#pragma once
#include <optional>
#include "engine/backend.h"

namespace duet {

inline void conv_epilogue_passes(BackendImpl& be, const Tensor& y, const Tensor& residual,
                                 std::optional<Activation> act) {
  if (y.numel() == 0) return;
  if (residual.defined()) be.binary(BinaryOp::add, y, residual, y);
  if (act) be.activation(*act, 0.0, y, y);
}

}  // namespace duet
