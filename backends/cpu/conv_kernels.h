// How each convolution algorithm of the planner (planner.h) runs one pass: conv.cpp builds and
// runs oneDNN's primitives (direct, blocked, Winograd), conv_gemm.cpp the matrix products
// (pointwise, im2col, one tap), depthwise.h duet's own loops. These run what they are given;
// the choice is the planner's.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <oneapi/dnnl/dnnl.hpp>
#include "backends/cpu/planner.h"

namespace duet::cpu {

// One pass with algorithm `a` (any of ConvAlgo). A backward pass may be handed dy already in the
// layout its oneDNN primitive wants (`dy_ready`, from shared_dy()).
// The forward computes conv2d's whole epilogue, act(conv + bias + residual) (engine/ops.def).
void run_conv_forward(ConvAlgo a, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                      const Tensor& y, const Conv2dParams& p);
void run_conv_backward_data(ConvAlgo a, const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p,
                            const std::optional<dnnl::memory>& dy_ready = std::nullopt);
void run_conv_backward_weight(ConvAlgo a, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                              const Conv2dParams& p, const std::optional<dnnl::memory>& dy_ready = std::nullopt);

// dy reordered once for both backward passes of one conv2d_backward, when both run oneDNN
// primitives that want it in the same layout other than its own (Winograd's blocked layout for
// channels-last tensors: resnet18_cifar's 13 such layers, about 110 MB per step in f32); nullopt
// otherwise. The memory lives in a per-thread scratch slot that neither pass uses for anything else.
std::optional<dnnl::memory> shared_dy(ConvAlgo data, ConvAlgo weight, const Tensor& dy, const Tensor& x,
                                      const Tensor& w, const Tensor& dx, const Tensor& dw, const Tensor& dbias,
                                      const Conv2dParams& p);

// The implementation oneDNN picks for a pass run with `a` (direct, direct_blocked or winograd) on
// these tensors, its primitive built and cached, or "" when oneDNN has none: what the planner asks
// before it plans Winograd or duet's depthwise loops.
std::string onednn_conv_impl(ConvAlgo a, ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y,
                             const Conv2dParams& p, bool bias);

// The part of conv2d's epilogue that duet's own kernels (direct_conv.h, winograd_conv.h, depthwise.h)
// apply in their store: the residual when it and y are f32 and laid out alike, and a ReLU (or a
// ReLU6, for kernels that say they clamp at 6) when no residual is left to add after the kernel.
// One decision for all of them; finish_store_epilogue runs the rest as passes after the kernel
// (engine/conv_epilogue.h), in the same order: residual, then activation.
struct StoreEpilogue {
  const float* residual = nullptr;  // added in the store, or nullptr
  bool relu = false;                // clamped at 0 in the store, after the residual
  bool relu6 = false;               // then at 6 too (only where relu is)
};
StoreEpilogue store_epilogue(const Tensor& y, const Tensor& residual, std::optional<Activation> act,
                             bool clamps_at_6 = false);
void finish_store_epilogue(const StoreEpilogue& in_store, const Tensor& y, const Tensor& residual,
                           std::optional<Activation> act);

// ---- conv_gemm.cpp: the passes as matrix products ---------------------------------------------------
// Pointwise convolutions on the [N*H*W, C] pixel rows of channels-last maps and the [O, C] weights.
// The forwards apply the epilogue inside the product where the residual is laid out as y is
// (channels-last pixel rows), else as passes after it (engine/conv_epilogue.h).
void pointwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                       std::optional<Activation> act);
void pointwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx);
void pointwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw);
// A weight gradient that `compute(out)` writes in [O, KH, KW, C] order (im2col's tap order): out is
// dw itself when dw is laid out so (channels-last), else a buffer copied into dw's layout after.
void weight_gradient_in_ohwi(const Tensor& dw, const std::function<void(const Tensor& out)>& compute);
// y = act(im2col(x) W^T + bias + residual) and dW = dy^T im2col(x), for kernels larger than 1x1.
void im2col_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                    const Conv2dParams& p);
void im2col_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p);
// dx = col2im(dy W): each output pixel's contributions to its receptive field, summed onto dx.
void col2im_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p);
// A KxK kernel over a 1x1 map (planner.h's single_tap): the passes with tap (th, tw) alone; the
// weight gradient is zero at every other tap.
void tap_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                 const Conv2dParams& p);
void tap_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p);
void tap_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                         const Conv2dParams& p);

}  // namespace duet::cpu
