// Batched f32 GEMM for small matrices (small_gemm.h), in AVX-512 intrinsics.
//
// One matrix product runs on one thread, start to end, so its operands stay in that core's L1
// and L2 (a 65 x 64 matrix is 16.6 KB). For C = A B:
//  * B is read in rows of 16 columns (one zmm register). When B's rows are not contiguous (B is
//    the transpose of a stored matrix: k^T in q @ k^T), it is first packed into a row-major
//    [K, N] scratch by 16 x 16 register transposes: 64 shuffles per 256 elements, against the
//    one-element loads and stores of a scalar transpose that cost as much as the product itself.
//  * The register block is 6 rows of C by 4 vectors of 16 columns: 24 accumulators;
//    each k step loads 4 vectors of B, broadcasts one element of A per row and issues 24 FMAs,
//    enough independent FMAs to keep both of Zen 5's FMA pipes busy through the 4-cycle latency
//    (with 4 rows, 16 accumulators, 128^3 products ran 10-20% slower). A is only ever broadcast
//    element by element, so it needs no packing in any layout.
//  * Columns past the last multiple of 16 go to masked vectors, or, when there are at most 4
//    of them (65 = 4 x 16 + 1 in ViT-tiny), to dot products: a masked vector for one column
//    would spend 16 lanes of FMA on 1 useful lane, a quarter of the whole product's time.
#include "backends/cpu/small_gemm.h"

// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_ps() and then warn about
// it wherever they are inlined (GCC bug 105593, fixed in GCC 13).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "backends/cpu/common.h"

namespace duet::cpu {

namespace {

// Automatic policy: every dimension at most this. At 128 the kernel matched oneDNN (NN, NT); at
// 197 and 256 it was up to 10% behind on TN products (oneDNN blocks for the caches, this does not).
constexpr int64_t kMaxDim = 128;

std::atomic<KernelPolicy> g_policy{policy_from_env("DUET_SMALL_GEMM")};

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

// The stored operands of one product: A(i, k) = a[i * sam + k * sak], B(k, n) = b[k * ldb + n]
// (B is row-major here, packed if it was not), C(i, n) = c[i * ldc + n].
struct Item {
  const float* a;
  int64_t sam, sak;
  const float* b;
  int64_t ldb;
  float* c;
  int64_t ldc;
  int64_t K;
};

// C[MR rows, NV vectors of 16 columns] = A[MR rows, :] B[:, NV vectors]; `last` masks the columns
// of the last vector (all 16 when the block is full).
// The loops over i < MR and j < NV carry `GCC unroll`: left to its size limits GCC unrolled them
// only partly, which put the accumulators in memory, loaded and stored every k step (3x slower).
template <int MR, int NV>
DUET_AVX512 inline void register_block(const Item& it, int64_t i0, int64_t n0, __mmask16 last) {
  const int64_t K = it.K, sam = it.sam, sak = it.sak, ldb = it.ldb, ldc = it.ldc;
  const float* a = it.a + i0 * sam;
  const float* b = it.b + n0;
  __m512 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int j = 0; j < NV - 1; ++j) bv[j] = _mm512_loadu_ps(b + k * ldb + 16 * j);
    bv[NV - 1] = _mm512_maskz_loadu_ps(last, b + k * ldb + 16 * (NV - 1));
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m512 av = _mm512_set1_ps(a[i * sam + k * sak]);
#pragma GCC unroll 4
      for (int j = 0; j < NV; ++j) acc[i][j] = _mm512_fmadd_ps(av, bv[j], acc[i][j]);
    }
  }
  float* c = it.c + i0 * ldc + n0;
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int j = 0; j < NV - 1; ++j) _mm512_storeu_ps(c + i * ldc + 16 * j, acc[i][j]);
    _mm512_mask_storeu_ps(c + i * ldc + 16 * (NV - 1), last, acc[i][NV - 1]);
  }
}

// All M rows of C for the NV vectors of columns at n0, 6 at a time.
template <int NV>
DUET_AVX512 void column_strip(const Item& it, int64_t M, int64_t n0, __mmask16 last) {
  int64_t i = 0;
  for (; i + 6 <= M; i += 6) register_block<6, NV>(it, i, n0, last);
  switch (M - i) {
    case 5: register_block<5, NV>(it, i, n0, last); break;
    case 4: register_block<4, NV>(it, i, n0, last); break;
    case 3: register_block<3, NV>(it, i, n0, last); break;
    case 2: register_block<2, NV>(it, i, n0, last); break;
    case 1: register_block<1, NV>(it, i, n0, last); break;
    default: break;
  }
}

DUET_AVX512 void column_strip(const Item& it, int64_t M, int64_t n0, int64_t cols) {
  const __mmask16 last = low_lanes(cols - 16 * ((cols - 1) / 16));
  switch ((cols + 15) / 16) {
    case 1: return column_strip<1>(it, M, n0, last);
    case 2: return column_strip<2>(it, M, n0, last);
    case 3: return column_strip<3>(it, M, n0, last);
    default: return column_strip<4>(it, M, n0, last);
  }
}

// dst[k * ldd + n] = src[n * lds + k] for n, k < 16: the 16 x 16 transpose in registers
// (interleave pairs of rows, then pairs of pairs, then 128-bit lanes twice).
DUET_AVX512 inline void transpose_16x16(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * lds);
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    const __m512d t0 = _mm512_castps_pd(t[i]), t1 = _mm512_castps_pd(t[i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[i + 2]), t3 = _mm512_castps_pd(t[i + 3]);
    r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xDD);
  }
  for (int i = 0; i < 8; ++i) {
    _mm512_storeu_ps(dst + i * ldd, _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88));
    _mm512_storeu_ps(dst + (i + 8) * ldd, _mm512_shuffle_f32x4(t[i], t[i + 8], 0xDD));
  }
}

// pack[k * ldp + n] = B(k, n) for n < N, for a B stored transposed (B(k, n) = bb[n * b.col + k]):
// the rows of the stored matrix are B's columns.
DUET_AVX512 void pack_transposed_b(const MatrixView& b, const float* bb, int64_t K, int64_t N, float* pack, int64_t ldp) {
  int64_t n = 0;
  for (; n + 16 <= N; n += 16) {
    int64_t k = 0;
    for (; k + 16 <= K; k += 16) transpose_16x16(bb + n * b.col + k, b.col, pack + k * ldp + n, ldp);
    for (; k < K; ++k)
      for (int64_t j = 0; j < 16; ++j) pack[k * ldp + n + j] = bb[(n + j) * b.col + k];
  }
  for (; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) pack[k * ldp + n] = bb[n * b.col + k];
}

// C(:, n) = A B(:, n) for one column, from B's column in `bcol` (K contiguous floats): dot products
// along K when A's rows are contiguous, else (its columns are) a broadcast of B(k, n) against 16
// rows of A at a time.
DUET_AVX512 void column_product(const Item& it, int64_t M, const float* bcol, float* c) {
  const int64_t K = it.K;
  if (it.sak == 1) {
    for (int64_t i = 0; i < M; ++i) {
      const float* a = it.a + i * it.sam;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 m = low_lanes(K - k);
        acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + k), _mm512_maskz_loadu_ps(m, bcol + k), acc);
      }
      c[i * it.ldc] = _mm512_reduce_add_ps(acc);
    }
    return;
  }
  for (int64_t i = 0; i < M; i += 16) {
    const __mmask16 m = low_lanes(M - i);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; ++k)
      acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, it.a + i + k * it.sak), _mm512_set1_ps(bcol[k]), acc);
    alignas(64) float out[16];
    _mm512_store_ps(out, acc);
    for (int64_t r = 0; r < 16 && i + r < M; ++r) c[(i + r) * it.ldc] = out[r];
  }
}

// pack[k * ldp + n] = B(k, n) for n < N, for a B with contiguous rows that are not 64-byte
// aligned: a 16-float load from them spans two cache lines (a TN product with 65-float rows ran
// at half the speed of its aligned twin).
DUET_AVX512 void pack_rows_b(const MatrixView& b, const float* bb, int64_t K, int64_t N, float* pack, int64_t ldp) {
  for (int64_t k = 0; k < K; ++k) std::memcpy(pack + k * ldp, bb + k * b.row, static_cast<size_t>(N) * sizeof(float));
}

bool aligned64(const float* p, int64_t row) { return reinterpret_cast<uintptr_t>(p) % 64 == 0 && row % 16 == 0; }

// One product C = A B, C with row stride ldc. `scratch` is 64-byte aligned and holds
// K * (N + 16) floats.
DUET_AVX512 void product(int64_t M, int64_t N, int64_t K, const MatrixView& a, const float* aa, const MatrixView& b,
                         const float* bb, float* c, int64_t ldc, float* scratch) {
  const int64_t tail = N % 16;
  const bool dot_tail = tail > 0 && tail <= 4;
  const int64_t vec_cols = dot_tail ? N - tail : N;  // columns the register blocks compute
  Item it{aa, a.row, a.col, bb, b.row, c, ldc, K};
  const int64_t ldp = (vec_cols + 15) / 16 * 16;
  if (vec_cols > 0 && b.col != 1) {
    pack_transposed_b(b, bb, K, vec_cols, scratch, ldp);
    it.b = scratch;
    it.ldb = ldp;
  } else if (vec_cols > 0 && !aligned64(bb, b.row)) {
    pack_rows_b(b, bb, K, vec_cols, scratch, ldp);
    it.b = scratch;
    it.ldb = ldp;
  }
  int64_t n0 = 0;
  for (; n0 + 64 <= vec_cols; n0 += 64) column_strip<4>(it, M, n0, __mmask16(0xFFFF));
  if (n0 < vec_cols) column_strip(it, M, n0, vec_cols - n0);
  float* bcol = scratch + K * ((N + 15) / 16 * 16);  // past the packed rows
  for (int64_t n = vec_cols; n < N; ++n) {
    for (int64_t k = 0; k < K; ++k) bcol[k] = bb[k * b.row + n * b.col];
    column_product(it, M, bcol, c + n);
  }
}

}  // namespace

void set_small_gemm_policy(KernelPolicy p) { g_policy.store(p); }
bool small_gemm_available() { return cpu_has_avx512(); }
KernelPolicy small_gemm_policy() { return g_policy.load(); }

bool small_gemm_wanted(int64_t batch, int64_t M, int64_t N, int64_t K) {
  const KernelPolicy p = small_gemm_policy();
  if (p == KernelPolicy::never || !cpu_has_avx512() || K < 1) return false;
  if (p == KernelPolicy::always) return true;
  return M <= kMaxDim && N <= kMaxDim && K <= kMaxDim && batch >= max_threads();
}

void small_gemm_f32(int64_t batch, int64_t M, int64_t N, int64_t K, MatrixView a, MatrixView b, float* c) {
  DUET_CHECK(cpu_has_avx512(), "small_gemm_f32: this CPU has no AVX-512 (small_gemm_wanted says so first)");
  DUET_CHECK((a.row == 1 || a.col == 1) && (b.row == 1 || b.col == 1),
             "small_gemm_f32: each operand needs contiguous rows or contiguous columns");
  parallel_for(batch, batch * M * N * K, [&](int64_t b0, int64_t b1) {
    thread_local std::vector<float> buffer;  // the team's threads persist: no allocation per call
    buffer.resize(static_cast<size_t>(small_gemm_scratch_floats(K, N)));
    float* scratch = align64(buffer.data());
    for (int64_t i = b0; i < b1; ++i)
      product(M, N, K, a, a.data + i * a.batch, b, b.data + i * b.batch, c + i * M * N, N, scratch);
  });
}

int64_t small_gemm_scratch_floats(int64_t K, int64_t N) { return K * ((N + 15) / 16 * 16 + 1) + 16; }

void small_gemm_one(int64_t M, int64_t N, int64_t K, const MatrixView& a, const MatrixView& b, float* c, int64_t ldc,
                    float* scratch) {
  DUET_CHECK(cpu_has_avx512() && K >= 1 && (a.row == 1 || a.col == 1) && (b.row == 1 || b.col == 1),
             "small_gemm_one: needs AVX-512, K >= 1 and operands with contiguous rows or columns");
  product(M, N, K, a, a.data, b, b.data, c, ldc, align64(scratch));
}

}  // namespace duet::cpu
