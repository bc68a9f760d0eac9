// Multi-head self-attention on the cpu backend, f32 on CPUs with AVX-512 (fuses_attention): one
// task per image and head, run by one thread from start to end, so that its q, k and v (65 x 64
// floats each in ViT-tiny), its [S, S] probabilities and the products' operands stay in that
// core's L1 and L2. q, k and v are read where the in-projection wrote them (rows of 3D floats),
// the output goes straight into its heads-side-by-side layout and the gradients into the packed
// layout of qkv. The composed path (engine/ops/attention.cpp) instead copies k^T, v and the scaled
// q into dense blocks, merges the heads with a permuted copy, and writes the three gradients back
// into the packed buffer with three more. Products: small_gemm_one; the maths, written out:
// backends/reference/attention.cpp.
#include <cmath>
#include <limits>
#include <vector>
#include "backends/cpu/common.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/small_gemm.h"
#include "backends/cpu/vmath.h"

namespace duet {
using namespace cpu;

namespace {

#define DUET_AVX512_FN __attribute__((target("avx512f")))

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

// Each row z_i of the [S, S] block becomes softmax(scale z_i); scale > 0, so the row's maximum
// scales with it.
DUET_AVX512_FN void softmax_rows(float* z, int64_t S, float scale) {
  for (int64_t i = 0; i < S; ++i) {
    float* r = z + i * S;
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int64_t j = 0; j < S; ++j) mx = std::max(mx, r[j]);
    const float shift = mx * scale;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < S; ++j) {
      const float e = vmath::exp_nonpositive(r[j] * scale - shift);
      r[j] = e;
      sum += e;
    }
    const float inv = 1.0f / sum;
#pragma omp simd
    for (int64_t j = 0; j < S; ++j) r[j] *= inv;
  }
}

// dz := scale * P * (dz - rowsum(P * dz)): the gradient of the scaled scores from that of the probabilities.
DUET_AVX512_FN void softmax_rows_backward(const float* P, float* dz, int64_t S, float scale) {
  for (int64_t i = 0; i < S; ++i) {
    const float* p = P + i * S;
    float* g = dz + i * S;
    float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
    for (int64_t j = 0; j < S; ++j) dot += p[j] * g[j];
#pragma omp simd
    for (int64_t j = 0; j < S; ++j) g[j] = scale * p[j] * (g[j] - dot);
  }
}

// The thread's scratch: `floats` of it, reused from call to call (the team's threads persist).
float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(floats)) buffer.resize(static_cast<size_t>(floats));
  return buffer.data();
}

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
  parallel_for(N * heads, N * heads * S * S * Dh * 4, [&](int64_t t0, int64_t t1) {
    float* scratch = thread_scratch(gemm_scratch);
    for (int64_t t = t0; t < t1; ++t) {
      const HeadViews a(S, D, heads, t);
      float* P = pp + a.p;
      // P = q k^T (k^T(d, j) = k[j, d]: contiguous columns), then the rows' softmax.
      small_gemm_one(S, S, Dh, {x + a.q, 0, 3 * D, 1}, {x + a.k, 0, 1, 3 * D}, P, S, scratch);
      softmax_rows(P, S, static_cast<float>(scale));
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
  parallel_for(N * heads, N * heads * S * S * Dh * 8, [&](int64_t t0, int64_t t1) {
    float* dz = thread_scratch(S * S + gemm_scratch);
    float* scratch = dz + S * S;
    for (int64_t t = t0; t < t1; ++t) {
      const HeadViews a(S, D, heads, t);
      const float* P = pp + a.p;
      const MatrixView dO{pdo + a.o, 0, D, 1};
      // dP = dO v^T, then dZ (scaled) in place.
      small_gemm_one(S, S, Dh, dO, {x + a.v, 0, 1, 3 * D}, dz, S, scratch);
      softmax_rows_backward(P, dz, S, static_cast<float>(scale));
      small_gemm_one(S, Dh, S, {dz, 0, S, 1}, {x + a.k, 0, 3 * D, 1}, dx + a.q, 3 * D, scratch);  // dq = dZ k
      small_gemm_one(S, Dh, S, {dz, 0, 1, S}, {x + a.q, 0, 3 * D, 1}, dx + a.k, 3 * D, scratch);  // dk = dZ^T q
      small_gemm_one(S, Dh, S, {P, 0, 1, S}, dO, dx + a.v, 3 * D, scratch);                        // dv = P^T dO
    }
  });
  profiler::note_impl("duet attention (AVX-512 small GEMMs, q/k/v in place)");
}

}  // namespace duet
