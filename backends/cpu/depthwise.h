// Depthwise convolution (groups = input channels = output channels) on channels-last activations,
// duet's own OpenMP kernels. oneDNN 2.6 has fast jit kernels for most depthwise shapes, but when
// the input is tiny (MobileNet's last stages at 32x32 inputs: 1x1 and 2x2 maps with a 3x3 kernel)
// it falls back to im2col + GEMM, its reference loops or its dense grouped-conv kernel: measured
// here (1 thread) at 13.5 ms forward and 29.5 ms backward for [64, 960, 1, 1] with a 3x3 kernel
// (these kernels: 0.1 and 0.2 ms), and 0.84 ms backward for [64, 576, 2, 2] stride 2 (0.17 ms).
// For one image of those stages a call of oneDNN's also costs more than the sums, so the planner
// gives these kernels the forwards of one thread's work too (planner.cpp's depthwise_rule).
// Elsewhere oneDNN's kernels stay: they are about 2x faster per multiply-add than these.
// The forward keeps the sums of up to 8 output pixels of 16 channels in registers and applies the
// epilogue (relu, relu6, a residual) in its store; the data gradient keeps the channel loop
// innermost (contiguous in NHWC, so it vectorises) and touches every input once per kernel tap;
// the weight gradient keeps up to 8 taps of 16 channels in registers along each output row and
// adds any per-thread partial sums in a fixed order, so results do not depend on timing. They take
// f32 and bf16 (bf16 storage, f32 sums).
#pragma once
#include "backends/cpu/kernel_policy.h"
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet::cpu {

// Which depthwise convolutions these kernels take: automatic (where oneDNN would use no depthwise
// kernel of its own, and forwards of one thread's work), always (every applicable one: tests use
// it) or never; DUET_DEPTHWISE sets it at start-up.
void set_depthwise_policy(KernelPolicy p);
KernelPolicy depthwise_policy();

// f32 or bf16 depthwise (bf16 storage, f32 sums) with channel multiplier 1 and every activation's channels contiguous (stride 1:
// channels-last, or any layout when H = W = 1).
bool depthwise_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);

// The forward applies conv2d's epilogue (the residual when defined, then p.act) in its store where
// it can (store_epilogue), else as passes after it.
void depthwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                       const Conv2dParams& p);
void depthwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p);
void depthwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                               const Conv2dParams& p);

}  // namespace duet::cpu
