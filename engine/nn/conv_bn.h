// A convolution followed by its batch norm, with an optional residual and activation after them:
// act(bn(conv(x)) + residual), the common shape of ResNet's, MobileNet's and DenseNet's layers.
//
// Training (or any model not frozen for inference): the convolution, then one fused batch norm
// pass (BatchNorm2d::forward_act / forward_add), as before. A frozen model in eval mode
// (nn::Module::freeze, FrozenForInference), where the batch norm is a fixed affine map per channel:
// the map is folded into the convolution's weights and bias once per freeze,
//   s = gamma / sqrt(running_var + eps),  w' = w * s (per output channel),  b' = beta + (b - mean) * s,
// and the whole layer is one conv2d with the residual and activation as its epilogue (ops.def), so
// an inference pass writes each layer's output once instead of twice, and reads no statistics. ONNX
// Runtime and PyTorch's frozen graphs fold the same way. The folded copies are kept with the frozen
// weights' other copies (engine/frozen_copies.h), keyed by the freeze of every tensor they are
// computed from, so a change to any of them while unfrozen is never served stale.
#pragma once
#include <optional>
#include "engine/nn/layers.h"

namespace duet::nn {

Tensor conv_bn(Conv2d& conv, BatchNorm2d& bn, const Tensor& x, std::optional<Activation> act,
               const Tensor& residual = Tensor());

// Whether conv_bn folds this pair now: bn in eval mode, every tensor of both frozen, and no
// gradient wanted through them.
bool folds_batch_norm(const Conv2d& conv, const BatchNorm2d& bn);

}  // namespace duet::nn
