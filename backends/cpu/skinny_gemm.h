// duet's own f32 kernel for a matrix product with at most four rows: c = a @ b with a [M <= 4, K]
// and b [K, N] the transpose of a row-major [N, K] weight matrix, plus a bias, a residual and
// relu/relu6. This is batch-1 inference's product: a pointwise convolution on a 1x1 or 2x2 map
// (MobileNetV2's 160 -> 960 on 1x1, DenseNet-121's 1x1 convolutions on its last blocks) and a
// classifier. Its time is the time to read the weight matrix once (0.1-1.6 MB, from L3 between
// two passes), and oneDNN 2.6's brgemm matmul reads it at about two thirds of the rate a plain
// dot-product loop does: 30.2 against 19.5 us for 960 x 160 after a cache sweep (journal, 2026-11-29).
// Below AVX-512 (AMD Zen 3) the same loop in AVX2 took DenseNet-121's 4-row layers from 51 to 41 us
// a call and its 1-row layers from 33 to 25 (per-op profiles at batch 1, 32 px). From 5 rows on
// oneDNN stays faster on both CPUs (16 rows tied on Zen 3; 64 rows took 1.7x oneDNN's time).
//
// Each output is a dot product of a row of a with a row of the weights, both contiguous: a block
// of 4 outputs x M rows keeps 4M accumulators, and each 16-float chunk of the 4 weight rows is
// loaded once and used by every row of a. The threads take contiguous ranges of outputs, so each
// streams its own part of the weights. The result does not depend on whether the weights are
// frozen, so a frozen model computes the bits of the unfrozen one.
#pragma once
#include <cstdint>

#include "backends/cpu/gemm.h"
#include "backends/cpu/kernel_policy.h"

namespace duet::cpu {

constexpr int64_t kSkinnyMaxRows = 4;

// automatic and always: the kernel for every product it takes (below) on CPUs with AVX-512 or AVX2; never:
// oneDNN's matmul (DUET_SKINNY_GEMM=0 in the environment sets this at start-up).
void set_skinny_gemm_policy(KernelPolicy p);
KernelPolicy skinny_gemm_policy();

// Whether the policy gives this product to skinny_gemm_f32: f32 operands (the bias too), at most
// kSkinnyMaxRows rows, a's rows and the weights' rows contiguous (a.col == 1, b.row == 1), c's
// and the residual's rows contiguous, no activation but relu or relu6, no accumulation into c, and
// AVX-512 or AVX2 with FMA.
bool skinny_gemm_wanted(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                        const GemmEpilogue& epi);

// The kernel's name in profiles: duet:skinny_gemm_avx512, or duet:skinny_gemm_avx2 below AVX-512.
const char* skinny_gemm_impl();

// c = act(a @ b + bias + residual), as gemm() computes it (gemm.h).
void skinny_gemm_f32(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                     const GemmEpilogue& epi);

}  // namespace duet::cpu
