// duet's own direct convolution for CPUs with AVX2 and FMA but no AVX-512: a forward pass on
// channels-last f32 maps, computed as an implicit matrix product (no im2col matrix is written).
//
// Why: below AVX-512 oneDNN 2.6 has neither brgemm nor Winograd convolutions, and its jit:avx2
// direct kernels reached about 100 GFLOP/s on ResNet's 3x3 layers where ONNX Runtime's (MLAS's)
// reached 160 on the same AMD Zen 3 (2 cores, bench/ort_layers.py). The mathematics is a matrix
// product C[P, O] = A[P, K] B[K, O] with P the output pixels, O the output channels and K the
// receptive field (taps x input channels). A is never formed: each output pixel reads its input
// pixels' channel vectors in place, one pointer per tap (a shared zero vector where the tap falls
// into the padding). The register tile is the classic AVX2 one (BLIS's Haswell sgemm): 6 pixels by
// 16 output channels, 12 accumulators, 2 weight vectors and 1 broadcast input of the 16 ymm
// registers, 8 loads per 12 FMAs. The weights are packed once per call (kept for frozen weights)
// as 16-channel panels in the order the kernel reads them. The weight gradient is the same kind of
// product with the output pixels as its long sum (direct_conv.cpp says how it is blocked).
#pragma once
#include "backends/cpu/gemm.h"
#include "backends/cpu/kernel_policy.h"
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet::cpu {

// f32 x, w and y, one group, x and y channels-last and dense, and a CPU that runs AVX2 and FMA.
// Any kernel size, stride, padding and dilation; any weight layout.
bool own_direct_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);

// The data gradient of a stride-1 convolution as the same kernel's forward of dy by the weights
// turned 180 degrees with their channels swapped (planner.h's flipped forward), the flipped
// weights packed straight from w; dx, w, dy as own_direct_applicable wants them.
bool own_direct_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p);
void own_direct_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p);

// The weight gradient dw = dy^T x over every tap (dw in any layout; no bias gradient): x and dy as
// own_direct_applicable wants x and y.
void own_direct_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p);

// y = act(conv(x, w) + bias + residual): the bias, a residual laid out as y and a relu are applied
// to the accumulators before they are stored; another activation, or a residual in another
// layout, runs as passes after (engine/conv_epilogue.h).
void own_direct_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                        const Conv2dParams& p);

// ---- matrix products as 1x1 convolutions ----------------------------------------------------------
//
// c = act(a @ b + bias + residual) with b [K, N] the transpose of a row-major [N, K] weight matrix:
// a linear layer, or a pointwise convolution that runs as a product (conv_gemm.cpp), is this
// kernel's 1x1 convolution of a map of a.rows pixels with K channels into N. Below AVX-512 oneDNN
// 2.6 runs these products on its `gemm:jit` sgemm, which reached 55-64 GFLOP/s on one AMD Zen 3
// thread for ViT-tiny's 65-row layers (journal, 2026-11-30, evening). The register tile applies
// the bias, a residual laid out as c, and relu or relu6 in its store.

// automatic: the products own_direct_matmul_wanted accepts of at most kDirectMatmulMaxMacs
// multiply-adds, on CPUs with AVX2 and FMA but not AVX-512 (where oneDNN's brgemm matmul is the
// faster one); always: any size, also with AVX-512 (tests); never: oneDNN's matmul
// (DUET_DIRECT_MATMUL=0 in the environment sets this at start-up).
//
// The bound: on two Zen 3 threads, each product alone in a loop with frozen weights, this kernel
// took 0.48-0.97 of oneDNN's time on 16 of 21 products up to ViT-tiny's 65-row layers (9.6
// million multiply-adds; oneDNN's sgemm pays a cost per call that small products do not cover),
// 0.99-1.04 on 4 and 1.10 on one (1024 x 64 -> 64); from 14 million on (96 to 4,160 rows of
// 192 -> 768) it took 1.06-1.16, where oneDNN's sgemm, which packs both operands, is the better
// one (journal, 2026-11-30, evening).
constexpr int64_t kDirectMatmulMaxMacs = 12'000'000;
void set_direct_matmul_policy(KernelPolicy p);
KernelPolicy direct_matmul_policy();

// f32 operands (the bias too) with contiguous rows laid out as a map's pixels (a's rows K apart,
// c's and the residual's N apart), the weights' rows contiguous, no activation but relu or relu6,
// no accumulation into c, and more rows than skinny_gemm.h takes.
bool own_direct_matmul_wanted(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                              const GemmEpilogue& epi);
constexpr const char* kOwnDirectMatmul = "duet:direct_nhwc_avx2 (matrix product as 1x1)";
void own_direct_matmul(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                       const GemmEpilogue& epi);

}  // namespace duet::cpu
