// Optimizer updates on the cpu backend: one fused pass per parameter reading param, grad and
// state once and writing them once (memory-bound, so the pass count is what matters).
//
// Each variant (momentum / nesterov / first step; Adam / AdamW) is its own branch-free
// `omp simd` loop over the flat buffer, compiled in DUET_SIMD_CLONES (AVX-512, AVX2 and the
// SSE2 baseline, picked at load time). The arithmetic is the reference's, operation for
// operation in the parameter's dtype, and this file is built without FMA contraction
// (-ffp-contract=off in CMakeLists.txt), so both backends give bit-identical parameters.
#include <cmath>
#include "backends/cpu/common.h"

namespace duet {
using namespace cpu;

namespace {

// ---- SGD ----------------------------------------------------------------------------------------

template <class T>
struct SgdArgs {
  T* __restrict w;
  const T* __restrict dw;
  T* __restrict buf;  // null without momentum
  T lr, wd, mom, damp;
  bool nesterov, first_step;
};

// g = dw + wd w; with momentum: buf = first ? g : mom buf + damp g, g = nesterov ? g + mom buf : buf;
// w -= lr g.
template <class T, bool kMomentum, bool kNesterov, bool kFirst>
[[gnu::always_inline]] inline void sgd_loop(const SgdArgs<T>& a, int64_t b, int64_t e) {
  T* __restrict w = a.w;
  const T* __restrict dw = a.dw;
  T* __restrict buf = a.buf;
  const T lr = a.lr, wd = a.wd, mom = a.mom, damp = a.damp;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    T g = dw[i] + wd * w[i];
    if constexpr (kMomentum) {
      T bi;
      if constexpr (kFirst) bi = g;
      else bi = mom * buf[i] + damp * g;
      buf[i] = bi;
      if constexpr (kNesterov) g = g + mom * bi;
      else g = bi;
    }
    w[i] -= lr * g;
  }
}

template <class T>
[[gnu::always_inline]] inline void sgd_chunk(const SgdArgs<T>& a, int64_t b, int64_t e) {
  if (!a.buf) return sgd_loop<T, false, false, false>(a, b, e);
  if (a.nesterov)
    return a.first_step ? sgd_loop<T, true, true, true>(a, b, e) : sgd_loop<T, true, true, false>(a, b, e);
  return a.first_step ? sgd_loop<T, true, false, true>(a, b, e) : sgd_loop<T, true, false, false>(a, b, e);
}

DUET_SIMD_CLONES void sgd_chunk_f32(const SgdArgs<float>& a, int64_t b, int64_t e) { sgd_chunk(a, b, e); }
DUET_SIMD_CLONES void sgd_chunk_f64(const SgdArgs<double>& a, int64_t b, int64_t e) { sgd_chunk(a, b, e); }
void sgd_chunk_any(const SgdArgs<float>& a, int64_t b, int64_t e) { sgd_chunk_f32(a, b, e); }
void sgd_chunk_any(const SgdArgs<double>& a, int64_t b, int64_t e) { sgd_chunk_f64(a, b, e); }

template <class T>
void sgd_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                bool first_step) {
  const SgdArgs<T> a{param.data<T>(), grad.data<T>(), p.momentum != 0.0 ? momentum_buf.data<T>() : nullptr,
                     T(p.lr), T(p.weight_decay), T(p.momentum), T(1.0 - p.dampening), p.nesterov, first_step};
  const int64_t n = param.numel();
  parallel_for(n, n * 3, [&](int64_t b, int64_t e) { sgd_chunk_any(a, b, e); });
}

// ---- Adam / AdamW ---------------------------------------------------------------------------------

template <class T>
struct AdamArgs {
  T* __restrict w;
  const T* __restrict dw;
  T* __restrict m;
  T* __restrict v;
  T step_size, bc2_sqrt, eps, b1, b2, one_minus_b1, one_minus_b2, wd, decay;
  bool decoupled;
};

// Adam: g = dw + wd w.  AdamW: w *= 1 - lr wd.
// m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g;  w -= step_size m / (sqrt(v) / sqrt(bc2) + eps)
template <class T, bool kDecoupled>
[[gnu::always_inline]] inline void adam_loop(const AdamArgs<T>& a, int64_t b, int64_t e) {
  T* __restrict w = a.w;
  const T* __restrict dw = a.dw;
  T* __restrict m = a.m;
  T* __restrict v = a.v;
  const T step_size = a.step_size, bc2_sqrt = a.bc2_sqrt, eps = a.eps, b1 = a.b1, b2 = a.b2;
  const T c1 = a.one_minus_b1, c2 = a.one_minus_b2, wd = a.wd, decay = a.decay;
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    T wi = w[i], g = dw[i];
    if constexpr (kDecoupled) wi = wi * decay;
    else g = g + wd * wi;
    const T mi = b1 * m[i] + c1 * g;
    const T vi = b2 * v[i] + c2 * g * g;
    m[i] = mi;
    v[i] = vi;
    w[i] = wi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
  }
}

template <class T>
[[gnu::always_inline]] inline void adam_chunk(const AdamArgs<T>& a, int64_t b, int64_t e) {
  if (a.decoupled) adam_loop<T, true>(a, b, e);
  else adam_loop<T, false>(a, b, e);
}

DUET_SIMD_CLONES void adam_chunk_f32(const AdamArgs<float>& a, int64_t b, int64_t e) { adam_chunk(a, b, e); }
DUET_SIMD_CLONES void adam_chunk_f64(const AdamArgs<double>& a, int64_t b, int64_t e) { adam_chunk(a, b, e); }
void adam_chunk_any(const AdamArgs<float>& a, int64_t b, int64_t e) { adam_chunk_f32(a, b, e); }
void adam_chunk_any(const AdamArgs<double>& a, int64_t b, int64_t e) { adam_chunk_f64(a, b, e); }

template <class T>
void adam_kernel(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamParams& p) {
  // Bias corrections are scalars, computed in double as the reference does.
  const double t = double(p.step);
  const double bc1 = 1.0 - std::pow(p.beta1, t), bc2 = 1.0 - std::pow(p.beta2, t);
  const AdamArgs<T> a{param.data<T>(), grad.data<T>(), exp_avg.data<T>(), exp_avg_sq.data<T>(),
                      T(p.lr / bc1), T(std::sqrt(bc2)), T(p.eps), T(p.beta1), T(p.beta2),
                      T(1.0 - p.beta1), T(1.0 - p.beta2), T(p.weight_decay), T(1.0 - p.lr * p.weight_decay),
                      p.decoupled};
  const int64_t n = param.numel();
  parallel_for(n, n * 6, [&](int64_t b, int64_t e) { adam_chunk_any(a, b, e); });
}

}  // namespace

void CpuBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                          bool first_step) {
  dispatch_float(param.dtype(), "sgd_step",
                 [&](auto tag) { sgd_kernel<decltype(tag)>(param, grad, momentum_buf, p, first_step); });
}

void CpuBackend::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const AdamParams& p) {
  dispatch_float(param.dtype(), "adam_step",
                 [&](auto tag) { adam_kernel<decltype(tag)>(param, grad, exp_avg, exp_avg_sq, p); });
}

}  // namespace duet
