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

}  // namespace duet::cpu
