// Multi-head self-attention on the cpu backend, f32 on CPUs with AVX-512 (fuses_attention): one
// task per image and head, run by one thread from start to end, so that its q, k and v (65 x 64
// floats each in ViT-tiny), its [S, S] probabilities and the products' operands stay in that
// core's L1 and L2. q, k and v are read where the in-projection wrote them (rows of 3D floats),
// the output goes straight into its heads-side-by-side layout and the gradients into the packed
// layout of qkv. The composed path (engine/ops/attention.cpp) instead copies k^T, v and the scaled
// q into dense blocks, merges the heads with a permuted copy, and writes the three gradients back
// into the packed buffer with three more. Products: small_gemm_one; the maths, written out:
// backends/reference/attention.cpp.
// GCC 12's AVX-512 headers start some intrinsics (the max and the reductions here) from
// _mm512_undefined_ps() and then warn about it wherever they are inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/cpu/common.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/small_gemm.h"
#include "backends/cpu/vmath.h"

namespace duet {
using namespace cpu;

namespace {

// Where head h of image n finds q, k, v (row stride 3D) and its columns of out (row stride D).
struct HeadViews {
  int64_t S, D, Dh;
  int64_t q, k, v, o, p;  // element offsets of q[0, 0], k[0, 0], v[0, 0], out[0, 0] and P[0, 0]
  HeadViews(int64_t S_, int64_t D_, int64_t heads, int64_t task) : S(S_), D(D_), Dh(D_ / heads) {
    const int64_t n = task / heads, h = task % heads;
    q = n * S * 3 * D + h * Dh;
    k = q + D;
    v = q + 2 * D;
    o = n * S * D + h * Dh;
    p = task * S * S;
  }
};

// Row i of P becomes softmax(scale z_i), z_i being row i of Z ([S, ldz], 64-byte aligned, ldz a
// multiple of 16; Z is overwritten). P is the dense [S, S] block of the probabilities tensor.
// 3x faster than three `omp simd` loops per row in place (ViT-tiny's 65-float rows,
// docs/cpu_backend.md): intrinsics, which GCC's vectorised short reductions were not; aligned rows,
// so that no load straddles two cache lines and the last partial vector is masked in a register,
// not in memory; and each pass over all rows before the next, so that a row's max and sum
// reductions (serial shuffle chains) overlap with other rows' work instead of stalling their own.
DUET_AVX512 void softmax_rows(float* Z, int64_t ldz, int64_t S, float scale, float* P, float* row_stats) {
  const int64_t vecs = (S + 15) / 16;
  const __mmask16 last = low_lanes(S - 16 * (vecs - 1));
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < S; ++i) {  // shift_i = scale * max_j z_ij (scale > 0)
    const float* z = Z + i * ldz;
    __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t v = 0; v + 1 < vecs; ++v) m = _mm512_max_ps(m, _mm512_load_ps(z + 16 * v));
    m = _mm512_mask_max_ps(m, last, m, _mm512_load_ps(z + 16 * (vecs - 1)));
    row_stats[i] = _mm512_reduce_max_ps(m) * scale;
  }
  for (int64_t i = 0; i < S; ++i) {  // z_ij := exp(scale z_ij - shift_i); row_stats_i := 1 / their sum
    float* z = Z + i * ldz;
    const __m512 shift = _mm512_set1_ps(row_stats[i]);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t v = 0; v < vecs; ++v) {
      __m512 e = vmath::exp_nonpositive(_mm512_fmsub_ps(_mm512_load_ps(z + 16 * v), vscale, shift));
      if (v + 1 == vecs) e = _mm512_maskz_mov_ps(last, e);
      _mm512_store_ps(z + 16 * v, e);
      sum = _mm512_add_ps(sum, e);
    }
    row_stats[i] = 1.0f / _mm512_reduce_add_ps(sum);
  }
  for (int64_t i = 0; i < S; ++i) {
    const float* z = Z + i * ldz;
    float* p = P + i * S;
    const __m512 inv = _mm512_set1_ps(row_stats[i]);
    for (int64_t v = 0; v + 1 < vecs; ++v) _mm512_storeu_ps(p + 16 * v, _mm512_mul_ps(_mm512_load_ps(z + 16 * v), inv));
    _mm512_mask_storeu_ps(p + 16 * (vecs - 1), last, _mm512_mul_ps(_mm512_load_ps(z + 16 * (vecs - 1)), inv));
  }
}

// dz := scale * P * (dz - rowsum(P * dz)): the gradient of the scaled scores from that of the
// probabilities. dz is [S, ldz] as Z above, P the dense [S, S] probabilities; the same two
// passes over all rows.
DUET_AVX512 void softmax_rows_backward(const float* P, float* dz, int64_t ldz, int64_t S, float scale, float* row_stats) {
  const int64_t vecs = (S + 15) / 16;
  const __mmask16 last = low_lanes(S - 16 * (vecs - 1));
  for (int64_t i = 0; i < S; ++i) {
    const float* p = P + i * S;
    const float* g = dz + i * ldz;
    __m512 dot = _mm512_setzero_ps();
    for (int64_t v = 0; v + 1 < vecs; ++v) dot = _mm512_fmadd_ps(_mm512_loadu_ps(p + 16 * v), _mm512_load_ps(g + 16 * v), dot);
    // Both operands masked: 0 * a NaN left in dz's padding by an earlier call would be NaN.
    dot = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(last, p + 16 * (vecs - 1)), _mm512_maskz_load_ps(last, g + 16 * (vecs - 1)), dot);
    row_stats[i] = _mm512_reduce_add_ps(dot);
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int64_t i = 0; i < S; ++i) {
    const float* p = P + i * S;
    float* g = dz + i * ldz;
    const __m512 dot = _mm512_set1_ps(row_stats[i]);
    for (int64_t v = 0; v < vecs; ++v) {
      // The last vector's lanes past S are masked off (P's last row ends the tensor).
      const __m512 pv = v + 1 < vecs ? _mm512_loadu_ps(p + 16 * v) : _mm512_maskz_loadu_ps(last, p + 16 * v);
      _mm512_store_ps(g + 16 * v, _mm512_mul_ps(_mm512_mul_ps(vscale, pv), _mm512_sub_ps(_mm512_load_ps(g + 16 * v), dot)));
    }
  }
}

// The thread's scratch: `floats` of it from a 64-byte boundary, reused from call to call (the
// team's threads persist).
float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(floats + 16)) buffer.resize(static_cast<size_t>(floats + 16));
  return align64(buffer.data());
}

// A row stride for [S, *] scratch blocks: whole 64-byte lines.
int64_t aligned_row(int64_t S) { return (S + 15) / 16 * 16; }

constexpr const char* kFallback = "reference loops: the cpu attention kernel is f32 on AVX-512 CPUs";

}  // namespace

bool CpuBackend::fuses_attention(DType dt) const {
  return dt == DType::f32 && small_gemm_available() && small_gemm_policy() != KernelPolicy::never;
}

void CpuBackend::attention(const Tensor& qkv, int64_t heads, double scale, const Tensor& out, const Tensor& probs) {
  if (!fuses_attention(qkv.dtype())) return reference_fallback(kFallback).attention(qkv, heads, scale, out, probs);
  const int64_t N = qkv.size(0), S = qkv.size(1), D = qkv.size(2) / 3, Dh = D / heads;
  const float* x = qkv.data<float>();
  float* po = out.data<float>();
  float* pp = probs.data<float>();
  const int64_t gemm_scratch = std::max(small_gemm_scratch_floats(Dh, S), small_gemm_scratch_floats(S, Dh));
  const int64_t ldz = aligned_row(S);
  parallel_for(N * heads, N * heads * S * S * Dh * 4, [&](int64_t t0, int64_t t1) {
    float* Z = thread_scratch(S * ldz + S + gemm_scratch);
    float* row_stats = Z + S * ldz;
    float* scratch = row_stats + S;
    for (int64_t t = t0; t < t1; ++t) {
      const HeadViews a(S, D, heads, t);
      float* P = pp + a.p;
      // Z = q k^T (k^T(d, j) = k[j, d]: contiguous columns), then P = the rows' softmax.
      small_gemm_one(S, S, Dh, {x + a.q, 0, 3 * D, 1}, {x + a.k, 0, 1, 3 * D}, Z, ldz, scratch);
      softmax_rows(Z, ldz, S, static_cast<float>(scale), P, row_stats);
      small_gemm_one(S, Dh, S, {P, 0, S, 1}, {x + a.v, 0, 3 * D, 1}, po + a.o, D, scratch);
    }
  });
  profiler::note_impl("duet attention (AVX-512 small GEMMs, q/k/v in place)");
}

void CpuBackend::attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads, double scale,
                                    const Tensor& dqkv) {
  if (!fuses_attention(qkv.dtype())) return reference_fallback(kFallback).attention_backward(qkv, probs, dout, heads, scale, dqkv);
  const int64_t N = qkv.size(0), S = qkv.size(1), D = qkv.size(2) / 3, Dh = D / heads;
  const float* x = qkv.data<float>();
  const float* pp = probs.data<float>();
  const float* pdo = dout.data<float>();
  float* dx = dqkv.data<float>();
  const int64_t gemm_scratch = std::max(small_gemm_scratch_floats(Dh, S), small_gemm_scratch_floats(S, Dh));
  const int64_t ldz = aligned_row(S);
  parallel_for(N * heads, N * heads * S * S * Dh * 8, [&](int64_t t0, int64_t t1) {
    float* dz = thread_scratch(S * ldz + S + gemm_scratch);
    float* row_stats = dz + S * ldz;
    float* scratch = row_stats + S;
    for (int64_t t = t0; t < t1; ++t) {
      const HeadViews a(S, D, heads, t);
      const float* P = pp + a.p;
      const MatrixView dO{pdo + a.o, 0, D, 1};
      // dP = dO v^T, then dZ (scaled) in place.
      small_gemm_one(S, S, Dh, dO, {x + a.v, 0, 1, 3 * D}, dz, ldz, scratch);
      softmax_rows_backward(P, dz, ldz, S, static_cast<float>(scale), row_stats);
      small_gemm_one(S, Dh, S, {dz, 0, ldz, 1}, {x + a.k, 0, 3 * D, 1}, dx + a.q, 3 * D, scratch);  // dq = dZ k
      small_gemm_one(S, Dh, S, {dz, 0, 1, ldz}, {x + a.q, 0, 3 * D, 1}, dx + a.k, 3 * D, scratch);  // dk = dZ^T q
      small_gemm_one(S, Dh, S, {P, 0, 1, S}, dO, dx + a.v, 3 * D, scratch);                        // dv = P^T dO
    }
  });
  profiler::note_impl("duet attention (AVX-512 small GEMMs, q/k/v in place)");
}

}  // namespace duet
