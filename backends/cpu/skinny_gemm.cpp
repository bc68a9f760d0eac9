// Products with at most four rows (skinny_gemm.h): the same blocks in AVX-512 and in AVX2 intrinsics.
#include "backends/cpu/skinny_gemm.h"

// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_ps() and then warn about
// it wherever they are inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <atomic>

#include "backends/cpu/common.h"
#include "backends/cpu/planner.h"
#include "backends/cpu/small_gemm.h"

namespace duet::cpu {

namespace {

std::atomic<KernelPolicy> g_policy{policy_from_env("DUET_SKINNY_GEMM")};

// Outputs per block: 4 weight rows streamed at once, 4 x M <= 16 accumulators.
constexpr int kBlock = 4;

// out[i] = the sum of v[i]'s 16 lanes, for 4 vectors at once: 11 shuffles and adds instead of
// four separate reductions' 20 or so. MobileNetV2's 4-row layers (batch 1, K = 64-576) took 3-4%
// less time than with _mm512_reduce_add_ps (journal, 2026-11-29).
DUET_AVX512 inline void sum4(const __m512 v[4], float out[4]) {
  // 128-bit quarters: [v0 q0+q2, v0 q1+q3, v1 q0+q2, v1 q1+q3], the same for v2, v3
  const __m512 t0 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
  const __m512 t1 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
  // quarter i: four partial sums of v[i]
  const __m512 u = _mm512_add_ps(_mm512_shuffle_f32x4(t0, t1, 0x88), _mm512_shuffle_f32x4(t0, t1, 0xDD));
  const __m512 w = _mm512_add_ps(u, _mm512_permute_ps(u, 0x4E));           // lanes (0+2, 1+3, 2+0, 3+1)
  const __m512 x = _mm512_add_ps(w, _mm512_permute_ps(w, 0xB1));           // every lane of quarter i: the sum
  // Lane 0 of each quarter into one 128-bit vector, written with one store: the epilogue's vector
  // load then reads it straight back (four scalar stores under one load stall its forwarding).
  const __m512 firsts = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12), x);
  _mm_storeu_ps(out, _mm512_castps512_ps128(firsts));
}

// dots[m][g] = a[m, :] . w[g, :] for M rows of a (row stride lda) and G weight rows (stride ldw),
// K elements each: 16-float chunks, a masked chunk for the last K % 16.
template <int M, int G>
DUET_AVX512 void dot_block(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t K, float dots[][kBlock]) {
  __m512 acc[M][G];
  for (int m = 0; m < M; ++m)
    for (int g = 0; g < G; ++g) acc[m][g] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 wv[G];
    for (int g = 0; g < G; ++g) wv[g] = _mm512_loadu_ps(w + g * ldw + k);
    for (int m = 0; m < M; ++m) {
      const __m512 av = _mm512_loadu_ps(a + m * lda + k);
      for (int g = 0; g < G; ++g) acc[m][g] = _mm512_fmadd_ps(av, wv[g], acc[m][g]);
    }
  }
  if (k < K) {
    const __mmask16 lanes = low_lanes(K - k);
    __m512 wv[G];
    for (int g = 0; g < G; ++g) wv[g] = _mm512_maskz_loadu_ps(lanes, w + g * ldw + k);
    for (int m = 0; m < M; ++m) {
      const __m512 av = _mm512_maskz_loadu_ps(lanes, a + m * lda + k);
      for (int g = 0; g < G; ++g) acc[m][g] = _mm512_fmadd_ps(av, wv[g], acc[m][g]);
    }
  }
  for (int m = 0; m < M; ++m) {
    if constexpr (G == kBlock) {
      sum4(acc[m], dots[m]);
    } else {
      for (int g = 0; g < G; ++g) dots[m][g] = _mm512_reduce_add_ps(acc[m][g]);
    }
  }
}

// ---- AVX2 (CPUs without AVX-512, such as AMD Zen 3): 8-float chunks ------------------------------

// out[g] = the sum of v[g]'s 8 lanes for G <= 4 vectors: three horizontal adds leave the four
// sums of each 128-bit half in order, and the two halves are added.
template <int G>
DUET_AVX2_FMA inline void sum_lanes8(const __m256 v[], float* out) {
  const __m256 z = _mm256_setzero_ps();
  const __m256 ab = _mm256_hadd_ps(v[0], G > 1 ? v[1] : z);  // a01 a23 b01 b23 | a45 a67 b45 b67
  const __m256 cd = _mm256_hadd_ps(G > 2 ? v[2] : z, G > 3 ? v[3] : z);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7
  const __m128 sums = _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
  if constexpr (G == 4) {
    _mm_storeu_ps(out, sums);  // one store, which the epilogue's vector load reads straight back
  } else {
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, sums);
    for (int g = 0; g < G; ++g) out[g] = lanes[g];
  }
}

// acc[m][g] += a[m, k..k+8) * w[g, k..k+8), the chunk's first lanes when Masked (the rest 0).
// Every chunk is loaded once into a register: left to itself GCC keeps a's chunks and folds the
// weights' loads into the FMAs, M times each, and the loop then waits on loads (12 for 8 FMAs at
// 4 rows by 2 outputs, where 6 suffice); the empty asm statements make it keep them.
template <int M, int G, bool Masked>
DUET_AVX2_FMA inline void fma_chunk(const float* a, int64_t lda, const float* w, int64_t ldw, __m256 acc[M][G],
                                    __m256i lanes) {
  const auto load = [](const float* p, __m256i l) DUET_AVX2_FMA {
    __m256 v = Masked ? _mm256_maskload_ps(p, l) : _mm256_loadu_ps(p);
    __asm__("" : "+x"(v));
    return v;
  };
  __m256 wv[G];
  for (int g = 0; g < G; ++g) wv[g] = load(w + g * ldw, lanes);
  for (int m = 0; m < M; ++m) {
    const __m256 av = load(a + m * lda, lanes);
    for (int g = 0; g < G; ++g) acc[m][g] = _mm256_fmadd_ps(av, wv[g], acc[m][g]);
  }
}

// dots[m][g0 + g] = a[m, :] . w[g, :], as dot_block above. M x G accumulators, G weight chunks
// and a chunk of a must fit AVX2's 16 registers. An FMA's result is ready 4 cycles after it
// starts and two start per cycle, so fewer than 8 accumulators leave the FMA units idle: blocks
// of at most 4 accumulators (one row of a, or the last block's few outputs) keep two sets, for
// even and odd chunks.
template <int M, int G>
DUET_AVX2_FMA void dot_part_avx2(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t K,
                                 float dots[][kBlock], int g0) {
  constexpr int kSets = M * G <= 4 ? 2 : 1;
  static_assert(kSets * M * G + G + 1 <= 16, "the block's accumulators and chunks must stay in registers");
  __m256 acc[kSets][M][G];
  for (int s = 0; s < kSets; ++s)
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) acc[s][m][g] = _mm256_setzero_ps();
  const __m256i all = _mm256_setzero_si256();  // unused by unmasked loads
  int64_t k = 0;
  // One row of a reads 64 bytes of each weight row per step of two chunks, at the rate L3 or
  // memory delivers them, and the hardware's prefetcher does not run far enough ahead on 4
  // interleaved rows: each step asks for the same 64 bytes of the next block's rows. (Blocks of
  // more rows do 2-4x the FMAs per byte and lost time to the prefetches: journal, 2026-11-30.)
  // The last block's prefetches point past the matrix, which a prefetch may: it never faults.
  const float* next = w + kBlock * ldw;
  for (; k + 8 * kSets <= K; k += 8 * kSets) {
    if constexpr (kSets == 2)
      for (int g = 0; g < G; ++g) _mm_prefetch(reinterpret_cast<const char*>(next + g * ldw + k), _MM_HINT_T0);
    for (int s = 0; s < kSets; ++s) fma_chunk<M, G, false>(a + k + 8 * s, lda, w + k + 8 * s, ldw, acc[s], all);
  }
  for (; k + 8 <= K; k += 8) fma_chunk<M, G, false>(a + k, lda, w + k, ldw, acc[0], all);
  if (k < K) {
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(K - k)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    fma_chunk<M, G, true>(a + k, lda, w + k, ldw, acc[0], lanes);
  }
  for (int s = 1; s < kSets; ++s)
    for (int m = 0; m < M; ++m)
      for (int g = 0; g < G; ++g) acc[0][m][g] = _mm256_add_ps(acc[0][m][g], acc[s][m][g]);
  for (int m = 0; m < M; ++m) sum_lanes8<G>(acc[0][m], dots[m] + g0);
}

// A block of G outputs; for three or four rows of a, 4 outputs would need 21 registers, so the
// block runs as two halves of at most 2 outputs (a's rows are read again, from L1; every weight
// row is still read once).
template <int M, int G>
DUET_AVX2_FMA void dot_block_avx2(const float* a, int64_t lda, const float* w, int64_t ldw, int64_t K,
                                  float dots[][kBlock]) {
  if constexpr (M * G + G + 1 <= 16) {
    dot_part_avx2<M, G>(a, lda, w, ldw, K, dots, 0);
  } else {
    dot_part_avx2<M, 2>(a, lda, w, ldw, K, dots, 0);
    dot_part_avx2<M, G - 2>(a, lda, w + 2 * ldw, ldw, K, dots, 2);
  }
}

// scalar_math.h's clamps on four lanes, NaN kept: maxps and minps return their second operand
// when either is NaN, so max(0, v) is `v < 0 ? 0 : v` and min(6, v) is `6 < v ? 6 : v`.
inline __m128 max0_keeping_nan(__m128 v) { return _mm_max_ps(_mm_setzero_ps(), v); }
inline __m128 min6_keeping_nan(__m128 v) { return _mm_min_ps(_mm_set1_ps(6.0f), v); }

using DotBlock = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float[][kBlock]);
template <int M>
constexpr DotBlock kDotBlocks[kBlock] = {dot_block<M, 1>, dot_block<M, 2>, dot_block<M, 3>, dot_block<M, 4>};
template <int M>
constexpr DotBlock kDotBlocksAvx2[kBlock] = {dot_block_avx2<M, 1>, dot_block_avx2<M, 2>, dot_block_avx2<M, 3>,
                                             dot_block_avx2<M, 4>};
// The block for M rows and G outputs in the widest vectors this CPU has.
DotBlock dot_block_for(int64_t M, int64_t G) {
  const bool avx512 = small_gemm_available();
  switch (M) {
    case 1: return (avx512 ? kDotBlocks<1> : kDotBlocksAvx2<1>)[G - 1];
    case 2: return (avx512 ? kDotBlocks<2> : kDotBlocksAvx2<2>)[G - 1];
    case 3: return (avx512 ? kDotBlocks<3> : kDotBlocksAvx2<3>)[G - 1];
    default: return (avx512 ? kDotBlocks<4> : kDotBlocksAvx2<4>)[G - 1];
  }
}

}  // namespace

const char* skinny_gemm_impl() {
  return small_gemm_available() ? "duet:skinny_gemm_avx512" : "duet:skinny_gemm_avx2";
}

void set_skinny_gemm_policy(KernelPolicy p) { g_policy.store(p); }
KernelPolicy skinny_gemm_policy() { return g_policy.load(); }

bool skinny_gemm_wanted(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                        const GemmEpilogue& epi) {
  if (skinny_gemm_policy() == KernelPolicy::never || !(small_gemm_available() || cpu_caps().avx2)) return false;
  const auto f32 = [](const Tensor& t) { return t.dtype() == DType::f32; };
  if (!f32(a.t) || !f32(b.t) || !f32(c.t) || (bias.defined() && !f32(bias))) return false;
  if (epi.accumulate || (epi.act && *epi.act != Activation::relu && *epi.act != Activation::relu6)) return false;
  if (epi.residual && (!f32(epi.residual->t) || epi.residual->col != 1)) return false;
  return a.rows >= 1 && a.rows <= kSkinnyMaxRows && a.cols >= 1 && a.col == 1 && b.row == 1 && c.col == 1;
}

void skinny_gemm_f32(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                     const GemmEpilogue& epi) {
  DUET_CHECK(skinny_gemm_wanted(a, b, c, bias, epi),
             "skinny_gemm_f32: expected f32, at most {} rows with contiguous rows and the weights' rows "
             "contiguous (skinny_gemm_wanted says so first)",
             kSkinnyMaxRows);
  const int64_t M = a.rows, K = a.cols, N = c.cols;
  const float* ap = static_cast<const float*>(a.t.raw_data());
  const float* wp = static_cast<const float*>(b.t.raw_data());  // weight row n at wp + n * ldw
  float* cp = static_cast<float*>(c.t.raw_data());
  const float* bp = bias.defined() ? static_cast<const float*>(bias.raw_data()) : nullptr;
  const float* rp = epi.residual ? static_cast<const float*>(epi.residual->t.raw_data()) : nullptr;
  // Plain locals: the epilogue's loop reads them for every output, and through the references
  // the compiler would have to reload them after every store.
  const int64_t lda = a.row, ldw = b.col, ldc = c.row, bias_step = bias.defined() ? bias.stride(0) : 0;
  const int64_t ldr = epi.residual ? epi.residual->row : 0;
  const bool relu = epi.act.has_value(), relu6 = relu && *epi.act == Activation::relu6;
  const int64_t blocks = (N + kBlock - 1) / kBlock;
  const DotBlock full = dot_block_for(M, kBlock);
  parallel_for(blocks, M * N * K, [=](int64_t b0, int64_t b1) {
    // Initialized: a last block leaves lanes unwritten, which the epilogue computes on, never stores.
    alignas(16) float dots[kSkinnyMaxRows][kBlock] = {};
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int64_t n0 = blk * kBlock, G = std::min<int64_t>(kBlock, N - n0);
      (G == kBlock ? full : dot_block_for(M, G))(ap, lda, wp + n0 * ldw, ldw, K, dots);
      // The epilogue in gemm()'s order (oneDNN's post-ops): bias, residual, activation, on the
      // block's 4 lanes; a last block of G < 4 outputs goes through a buffer of 4.
      alignas(16) float lanes[kBlock] = {};
      __m128 b4 = _mm_setzero_ps();
      if (bp && G == kBlock) {
        b4 = _mm_setr_ps(bp[n0 * bias_step], bp[(n0 + 1) * bias_step], bp[(n0 + 2) * bias_step],
                         bp[(n0 + 3) * bias_step]);
      } else if (bp) {
        for (int64_t g = 0; g < G; ++g) lanes[g] = bp[(n0 + g) * bias_step];
        b4 = _mm_load_ps(lanes);
      }
      for (int64_t m = 0; m < M; ++m) {
        __m128 v = _mm_load_ps(dots[m]);
        if (bp) v = _mm_add_ps(v, b4);
        if (rp) {
          const float* r = rp + m * ldr + n0;
          if (G < kBlock) {
            std::copy_n(r, G, lanes);
            r = lanes;
          }
          v = _mm_add_ps(v, _mm_loadu_ps(r));
        }
        if (relu) v = max0_keeping_nan(v);
        if (relu6) v = min6_keeping_nan(v);
        if (G == kBlock) {
          _mm_storeu_ps(cp + m * ldc + n0, v);
        } else {
          _mm_store_ps(lanes, v);
          std::copy_n(lanes, G, cp + m * ldc + n0);
        }
      }
    }
  });
}

}  // namespace duet::cpu
