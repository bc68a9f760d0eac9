// Which convolution algorithm the cpu backend asks oneDNN for. Direct convolution is exact to
// f32 rounding; Winograd F(4x4, 3x3) (oneDNN's jit_wino_4x3 kernels, forward and both backward
// passes) computes a 3x3 stride-1 convolution with 2.25x fewer multiplications, on oneDNN's
// blocked layout (activations are reordered around it). On this machine (2 threads, batch 64) it
// ran ResNet's 3x3 layers 1.5-2.6x faster, forward plus backward, than the best direct kernel;
// its rounding error is about twice direct convolution's (64->64 channels at 16x16 against an
// f64 reference: relative RMS error 8.0e-7 against 4.2e-7, largest error 5.6e-5 against 2.8e-5
// on outputs up to 38), far inside training noise and the conformance tolerance. cuDNN makes the same
// trade by default; PyTorch's CPU path does not use Winograd.
//
// oneDNN 2.6 has Winograd in f32 only. On a CPU whose bf16 runs on avx512_bf16 (not on AMX
// tiles), its f32 Winograd still beats the bf16 direct kernels on wide layers: ResNet's 256->256
// at 8x8 (batch 64, Zen 5, 2 threads) ran 3.6 / 3.7 / 4.9 ms forward / data / weight gradient
// against 4.5 / 4.9 / 6.0 in bf16; 512->512 at 8x8 13.7 / 14.1 / 18.1 against 17.0 / 21.2 / 24.7.
// Below 256 channels or onto 4x4 maps the bf16 kernels win the forward and the data gradient
// (128->128 at 8x8: 1.4 / 1.6 / 1.2 against 1.1 / 1.2 / 1.5; 512->512 at 4x4: 6.8 / 6.9 / 5.9
// against 4.2 / 4.7 / 6.1 in duet's profile; bench/onednn_conv_algos.cpp for the rest). So bf16
// tensors of such layers go through Winograd in f32: the reorders into and out of its blocked
// layout, which it needs anyway, convert them, and the result is rounded to bf16 once, as the
// bf16 kernels round their f32 sums. With AMX, bf16 has several times f32's peak: never there.
#pragma once
#include "backends/cpu/kernel_policy.h"
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet::cpu {

// automatic: Winograd for dense 3x3 stride-1 convolutions with at least 32 input and 32 output
// channels and an output map of at least 4x4, where oneDNN has a kernel for the channel counts
// (it says so by creating the primitive; else direct); in bf16 only without AMX, from 256
// channels on both sides and onto maps of at least 8x8.
// never: always direct (DUET_WINOGRAD=0 in the environment sets this at start-up).
// always: Winograd wherever oneDNN has it, small maps included (tests use it).
void set_winograd_policy(KernelPolicy p);
KernelPolicy winograd_policy();

// The ways one pass of a convolution can run: oneDNN's direct kernels on the tensors' own layout,
// the same on oneDNN's blocked layout (reorders around it), Winograd, or matrix products (the
// passes of a pointwise convolution; the weight gradient of a larger kernel on an im2col matrix).
enum class ConvAlgo : uint8_t { direct, direct_blocked, winograd, matmul };
enum class ConvPass : uint8_t { forward, backward_data, backward_weight };

// Whether oneDNN's Winograd can compute this convolution (f32 or bf16 tensors, dense 3x3, stride
// and dilation 1), and whether the policy asks for it.
bool winograd_applicable(const Tensor& x, const Tensor& w, const Conv2dParams& p);
bool winograd_wanted(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);
// Whether oneDNN runs bf16 on this CPU's AMX tiles (its effective ISA, which ONEDNN_MAX_CPU_ISA
// can lower).
bool bf16_on_amx();

// A pointwise convolution (1x1 kernel, stride 1, no padding, one group) of channels-last maps is
// one matrix product: the [N*H*W, C] pixel rows times the transposed [O, C] weights; its backward
// passes are the products with W and with the rows' transpose. On small maps oneDNN 2.6's 1x1
// convolution kernels split the work poorly between threads, and its matmul primitive runs the
// same products faster: DenseNet-121 at 32 px has its bottlenecks on 2x2 and 1x1 maps with up to
// 1,000 input channels, where the weight gradients ran 3-6x and the other passes 1.2-2.8x faster
// as matmul (2 threads, Zen 4 EPYC; docs/cpu_backend.md). From a few thousand rows up the
// convolution kernels are as fast or faster (ResNet-50's layers at 32x32 and 16x16 maps), and
// they stay.
//
// The weight gradient is a sum over all N*H*W rows into a small [O, C] result. oneDNN 2.6's 1x1
// kernels run that sum slowly when it is long and the channels few: ResNet-50's 64->256 layer at
// 32x32 and batch 64 (65,536 rows) at about half the GEMM ceiling. The matmul path cuts it into
// one chunk per thread (conv.cpp) and ran it 1.5x faster; from 4,096 to 16,384 rows the
// convolution kernels were as fast or up to 20% faster (Zen 5, docs/cpu_backend.md). The data
// gradient of the same layer (dy's 256 channels onto x's 64) ran on matmul 28 -> 23 ms per step,
// and no data gradient of 32,768 rows or more was slower there; below, matmul gained nothing.
// In bf16 the 1x1 weight-gradient kernel (jit_bf16_1x1) is weaker: 645-711 GFLOP/s on
// ResNet-50's layers at 8x8 and 16x16 (4,096 and 16,384 rows) against 711-861 on matmul, which
// was faster for five of its six shapes and as fast for the sixth (Zen 5); the bf16
// resnet50_cifar step ran 0.991x (six alternating pairs), MobileNetV2's 0.982x (four).
//
// automatic: as matmul when the maps are channels-last, the weights dense and N*H*W is at most
// 1,024 rows, the backward passes also from 32,768 rows up, and bf16 weight gradients from 4,096
// rows where bf16 has no AMX; the weight gradient only without a bias (its gradient would be a
// second pass, so the convolution kernel, which fuses it, keeps those).
// never: always oneDNN's convolution (DUET_POINTWISE_GEMM=0 in the environment sets this).
// always: as matmul wherever the shape and layouts allow, any size (tests use it).
void set_pointwise_gemm_policy(KernelPolicy p);
KernelPolicy pointwise_gemm_policy();

// Whether the convolution of x by w into y (any of its passes) can run as matrix products, and
// whether the policy runs it so.
bool pointwise_gemm_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);
bool pointwise_gemm_wanted(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);

// The weight gradient of a kernel larger than 1x1 as one matrix product: dy's [O, P] transpose
// times x's [P, KH*KW*C] im2col matrix (each of the P output pixels' receptive field, channels
// last, zeros where the window leaves the map), written as the [O, KH, KW, C] weight gradient.
// On small maps oneDNN 2.6's bf16 weight-gradient kernel (jit_bf16) runs far below the bf16
// GEMM ceiling: ResNet's 512->512 3x3 layer at 4x4 took 2.7x its forward's time (Zen 5,
// docs/cpu_backend.md). f32 has Winograd there, except on the strided layers that open ResNet's
// stages, where its direct kernel (jit) took 8.3 ms against 5.7 for 256->512 onto 4x4, and 7.0
// against 6.0 for 128->256 onto 8x8 (onto 16x16, 7.3 against 7.7: it keeps those).
// automatic: groups 1, channels-last maps, no bias gradient (the convolution kernel fuses it),
// and an output map of at most 16 pixels in bf16, or at most 64 in f32 where Winograd is not taken.
// never: oneDNN's kernel (DUET_IM2COL_WGRAD=0 in the environment sets this).
// always: wherever it applies, f32 too (tests use it).
void set_im2col_weight_gradient_policy(KernelPolicy p);
KernelPolicy im2col_weight_gradient_policy();
bool im2col_weight_gradient_applicable(const Tensor& x, const Tensor& dw, const Tensor& dy, const Conv2dParams& p);

// Autotuning, off by default (DUET_CONV_AUTOTUNE=1 in the environment turns it on at start-up).
// The rules above were measured on two or three CPUs; with autotuning, the first time a pass of a
// convolution meets a shape (with its layouts, dtype and thread count), every algorithm that can
// run it is timed on the call's own tensors, one warm-up and the median of three runs each, and
// the fastest is used for that shape from then on, like torch.backends.cudnn.benchmark. The first
// step pays for the timing, and two runs of a program may pick differently where two algorithms
// are close, so their results may differ by rounding (Winograd's error is about twice direct's).
// An algorithm a policy sets to never is not a candidate.
void set_conv_autotune(bool on);
bool conv_autotune();
// How many timed executions autotuning has run since start (warm-ups included): the second step
// of a training loop must add none.
int64_t conv_autotune_runs();

}  // namespace duet::cpu
