// duet's own Winograd convolution F(4x4, 3x3) for 3x3 stride-1 layers on CPUs with AVX2 and FMA:
// the three passes of a training step on channels-last f32 maps.
//
// Why: a 3x3 layer's 4x4 block of outputs needs 16 x 9 = 144 multiplications per input and output
// channel pair computed directly, and 36 computed in Winograd's transformed domain (Lavin & Gray,
// "Fast Algorithms for Convolutional Neural Networks", 2016): 4x fewer. oneDNN 2.6 has its Winograd
// kernels for AVX-512 only, so below it every 3x3 layer ran at the direct kernels' speed, already
// near the machine's sgemm rate (docs/cpu_backend.md).
//
// The mathematics: the output map is cut into 4x4 tiles, each seeing a 6x6 window of the input.
// Per tile and channel, the window d becomes V = B^T d B (6x6); per channel pair, the 3x3 kernel g
// becomes U = G g G^T (6x6). The 36 positions xi of the transformed domain are independent: for
// each, M[xi] = V[xi] U[xi] is a matrix product [tiles, C] x [C, O], the tile's output is then
// A^T M A (4x4). So a convolution becomes 36 matrix products (oneDNN's batched matmul, gemm.h)
// between transforms that read and write each element a few times. The data gradient of a stride-1
// layer is the forward of dy by the flipped weights (planner.h); the weight gradient runs the
// forward's steps backwards: dM = A dy A^T per tile, dU[xi] = V[xi]^T dM[xi] summed over the tiles
// (36 products), dw = G^T dU G. The transforms multiply by fractions, so the rounding error is
// larger than a direct sum's: about 7x in f32 (winograd_conv.cpp gives the figures).
#pragma once
#include <cstdint>
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet::cpu {

// f32 x, w and y, one group, a 3x3 kernel, stride 1, no dilation, padding of at most 2 (so that a
// data gradient's flipped forward, padded by 2 - padding, is one too), x and y channels-last and
// dense, and a CPU that runs AVX2 and FMA. Any weight layout.
bool own_winograd_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p);
bool own_winograd_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p);

// y = act(conv(x, w) + bias + residual): the bias, a residual laid out as y and a relu are applied in
// the output transform; another activation, or a residual in another layout, run as passes after.
void own_winograd_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                          const Conv2dParams& p);
// dx as the forward of dy by the weights turned 180 degrees with their channels swapped.
void own_winograd_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p);
// dw (any layout), no bias gradient. It runs in blocks of tiles, each block's 36 products added to
// the blocks' before, so that its workspace stays near 32 MB whatever the map.
void own_winograd_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p);
// The weight gradient's tiles per block, for tests: a few make a small map run in several blocks;
// 0 (the start) leaves the measured default (winograd_conv.cpp).
void set_own_winograd_gradient_block_tiles(int64_t tiles);

}  // namespace duet::cpu
