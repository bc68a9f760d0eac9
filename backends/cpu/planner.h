// The cpu backend's planner: the one place that decides which kernel runs each pass of a
// convolution, and why. plan_conv() takes the pass, the tensors (shapes, layouts, dtype), the
// attributes and what this CPU reports (CpuCaps), and returns the algorithm with the reason the
// profile's implementation column shows ("winograd: 3x3 stride 1, 64->64 channels, output 32x32").
// The rules are measurements (docs/cpu_backend.md gives each one's); with autotuning on, the
// candidates are timed on the call's own tensors instead and the plan says what each took. The
// kernels (conv.cpp, conv_gemm.cpp, depthwise.cpp) run plans and decide nothing; the front-end
// (engine/ops/conv.cpp) does the maths only.
//
// Each rule has a policy (kernel_policy.h): automatic (the rule), always (wherever the algorithm
// applies: tests force a path with it) or never; DUET_WINOGRAD, DUET_POINTWISE_GEMM,
// DUET_IM2COL_WGRAD, DUET_IM2COL_FORWARD, DUET_OWN_DIRECT, DUET_OWN_WINOGRAD set them at start-up, as
// DUET_CONV_AUTOTUNE=1 turns autotuning on.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include "backends/cpu/kernel_policy.h"
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet::cpu {

enum class ConvPass : uint8_t { forward, backward_data, backward_weight };

// The ways one pass of a convolution can run.
enum class ConvAlgo : uint8_t {
  direct,          // oneDNN's direct kernels on the tensors' own layout (channels-last in place)
  direct_blocked,  // the same on oneDNN's blocked layout (nChw16c), reorders around it
  winograd,        // oneDNN's Winograd F(4x4, 3x3), f32 on its blocked layout (bf16 converted)
  matmul,          // a pointwise convolution as matrix products on the [N*H*W, C] pixel rows
  im2col_matmul,   // a forward as x's im2col matrix times the weights; a weight gradient as dy^T times it
  tap_matmul,      // a KxK kernel over a 1x1 map: the one tap that sees the input, as matrix products
  own_depthwise,   // duet's depthwise loops (depthwise.h)
  flipped_forward, // a data gradient as oneDNN's forward convolution of dy by the flipped weights
  col2im_matmul,   // a data gradient as dy W, a column matrix scattered back onto dx (col2im)
  own_direct,      // duet's AVX2 direct kernel on channels-last f32 maps (direct_conv.h): a forward, a
                   // weight gradient (dy^T times x's taps), or a stride-1 data gradient as its forward
                   // of dy by the flipped weights
  own_winograd,    // duet's AVX2 Winograd F(4x4, 3x3) on channels-last f32 maps (winograd_conv.h): all
                   // three passes of a 3x3 stride-1 layer
};
const char* algo_name(ConvAlgo a);

// What this CPU reports, as oneDNN sees it (its effective ISA, which ONEDNN_MAX_CPU_ISA can lower),
// read once.
struct CpuCaps {
  bool avx2 = false;         // AVX2 and FMA: duet's own direct convolution (direct_conv.h) needs them
  bool avx512 = false;       // avx512_core: oneDNN's bf16 kernels need at least this
  bool avx512_bf16 = false;  // native bf16 dot products (vdpbf16ps)
  bool amx_bf16 = false;     // bf16 on AMX tiles (avx512_core_amx)
};
const CpuCaps& cpu_caps();

// One pass of one convolution: x the input (or dx), w the weight (or dw), y the output (or dy).
struct ConvProblem {
  ConvPass pass;
  const Tensor& x;
  const Tensor& w;
  const Tensor& y;
  const Conv2dParams& p;
  bool bias = false;  // forward: a bias is added; weight gradient: the bias gradient is summed too
};

struct ConvPlan {
  ConvAlgo algo = ConvAlgo::direct;
  std::string reason;  // shown in the profile after the kernel's own name, in brackets
};

// The plan of one pass: the rules' choice, or with autotuning on, the fastest candidate, timed
// by `run(algo)` (which executes the pass with that algorithm). Made once per shape (and policies)
// and remembered; the reference stays valid for the life of the process.
const ConvPlan& plan_conv(const ConvProblem& pb, const std::function<void(ConvAlgo)>& run);

// The policies of the rules (docs/cpu_backend.md says what each rule does and why).
void set_winograd_policy(KernelPolicy p);
KernelPolicy winograd_policy();
void set_pointwise_gemm_policy(KernelPolicy p);
KernelPolicy pointwise_gemm_policy();
void set_im2col_weight_gradient_policy(KernelPolicy p);
KernelPolicy im2col_weight_gradient_policy();
void set_im2col_forward_policy(KernelPolicy p);  // DUET_IM2COL_FORWARD
KernelPolicy im2col_forward_policy();
void set_flipped_data_gradient_policy(KernelPolicy p);  // DUET_FLIPPED_DGRAD
KernelPolicy flipped_data_gradient_policy();
void set_col2im_data_gradient_policy(KernelPolicy p);   // DUET_COL2IM_DGRAD
KernelPolicy col2im_data_gradient_policy();
void set_own_direct_policy(KernelPolicy p);             // DUET_OWN_DIRECT
KernelPolicy own_direct_policy();
void set_own_winograd_policy(KernelPolicy p);           // DUET_OWN_WINOGRAD
KernelPolicy own_winograd_policy();
// Autotuning, off by default: the first time a pass meets a shape (with its layouts, dtype and
// thread count), every algorithm that can run it is timed, one warm-up and the median of three
// runs each, and the fastest is used for that shape from then on, like
// torch.backends.cudnn.benchmark. Two runs of a program may then pick differently where two
// algorithms are close, so their results may differ by rounding.
void set_conv_autotune(bool on);
bool conv_autotune();
// How many timed executions autotuning has run since start (warm-ups included): the second step
// of a training loop must add none.
int64_t conv_autotune_runs();

// The facts the rules read, exposed for the tests that force or check a path.
bool winograd_applicable(const Tensor& x, const Tensor& w, const Conv2dParams& p);
bool pointwise_gemm_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);
bool im2col_weight_gradient_applicable(const Tensor& x, const Tensor& dw, const Tensor& dy, const Conv2dParams& p);
// The forward as im2col(x) [N*OH*OW, KH*KW*C] times the weights' [O, KH*KW*C] matrix: the same
// conditions (one group, a kernel larger than 1x1, f32 or bf16, channels-last x and y).
bool im2col_forward_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);
// A data gradient of a stride-1 convolution is the forward convolution of dy by the weights turned
// 180 degrees with input and output channels swapped, padded by dilation * (K - 1) - padding.
bool flipped_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p);
// That forward's parameters: p's stride and dilation, padded by dilation * (K - 1) - padding, no epilogue.
Conv2dParams flipped_forward_params(const Conv2dParams& p, const Tensor& w);
bool col2im_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p);
// A KxK kernel over a 1x1 map with one output pixel sees the input through one tap: its offset
// (th, tw) into the kernel, or false.
bool single_tap(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p, int64_t& th, int64_t& tw);
bool bf16_on_amx();
// Whether a bf16 convolution of input x, weights w and output y (any of its passes: the data
// gradient's dx has x's shape, dy y's) runs its arithmetic in f32 (bf16_speed.h's
// bf16_product_in_f32, on its FLOPs and the elements of x, w and y), and why, for the profile.
// Never for depthwise layers (one input channel per group), whose loops are bound by memory.
bool bf16_conv_in_f32(const Tensor& x, const Tensor& w, const Tensor& y, int64_t groups);
std::string bf16_conv_in_f32_reason(const Tensor& x, const Tensor& w, const Tensor& y);

}  // namespace duet::cpu
