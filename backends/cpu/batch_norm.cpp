// Batch norm on the cpu backend: OpenMP loops on dense NCHW, NHWC and [N, C] tensors (f32; bf16 in
// the row layouts), oneDNN's primitives (jit AVX-512) on other layouts, given the variance 1/invstd^2
// with epsilon 0 so that their backward reproduces the forward's invstd exactly. Layer norm: layer_norm.cpp.
#include <cmath>
#include <span>
#include <type_traits>
#include "backends/cpu/common.h"
#include "backends/cpu/norm_common.h"
#include "engine/half.h"
#include "engine/scalar_math.h"

namespace duet {
using namespace cpu;

namespace {

using nf = dnnl::normalization_flags;

struct BnFwd {
  dnnl::batch_normalization_forward::primitive_desc pd;
  dnnl::batch_normalization_forward prim;
  dnnl::memory::desc x, y, vec;
};
struct BnBwd {
  dnnl::batch_normalization_backward::primitive_desc pd;
  dnnl::batch_normalization_backward prim;
  dnnl::memory::desc x, dy, dx, vec;
};

dnnl::batch_normalization_forward::primitive_desc bn_fwd_pd(const dnnl::memory::desc& x, float eps, nf flags,
                                                            bool training) {
  return dnnl::batch_normalization_forward::primitive_desc(
      dnnl::batch_normalization_forward::desc(
          training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference, x, eps, flags),
      engine());
}

// ---- batch norm as OpenMP loops -------------------------------------------------------------------
// oneDNN 2.6 runs plain-NCHW batch norm in its generic ncsp kernel, about 10x slower than its NHWC
// jit kernel, and the jit kernel reads x three times in training (mean, variance, then the
// normalisation). These loops read it twice: sums of x and x^2 in one pass, then the affine map.
// The backward is two passes too (sums of dy and dy*x, then dx). NCHW is walked plane by plane (an
// (n, c) plane is contiguous); NHWC and [N, C] row by row (a row holds the C channels of one pixel,
// and the loop along C vectorises with per-channel accumulators). The sums are double, so the
// cancellation in E[x^2] - E[x]^2 is harmless unless the mean is ~1e6 standard deviations.

bool is_nchw(const Tensor& x) { return x.dim() == 4 && x.is_contiguous() && x.size(1) > 1 && x.size(2) * x.size(3) > 1; }
// Rows of C contiguous channels: channels-last 4-d, or a dense [N, C] batch.
bool is_rows(const Tensor& x) {
  return (x.dim() == 4 && x.is_contiguous(MemoryFormat::channels_last)) || (x.dim() == 2 && x.is_contiguous());
}

// Sum and sum of squares of a contiguous span, eight lanes of double (no reassociation flags).
inline void span_moments(const float* x, int64_t n, double& s1, double& s2) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      const double v = x[i + j];
      a[j] += v;
      b[j] += v * v;
    }
  for (; i < n; ++i) {
    a[0] += x[i];
    b[0] += double(x[i]) * x[i];
  }
  for (int j = 0; j < 8; ++j) s1 += a[j], s2 += b[j];
}
inline void span_dot(const float* dy, const float* x, int64_t n, double& sdy, double& sdyx) {
  double a[8] = {0, 0, 0, 0, 0, 0, 0, 0}, b[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) {
      a[j] += dy[i + j];
      b[j] += double(dy[i + j]) * x[i + j];
    }
  for (; i < n; ++i) {
    a[0] += dy[i];
    b[0] += double(dy[i]) * x[i];
  }
  for (int j = 0; j < 8; ++j) sdy += a[j], sdyx += b[j];
}

// Per-channel sums (s of u, q of v) of an NCHW tensor pair: one channel's planes per iteration.
// With b == a, the sums of a and a^2; else of a and a*b.
void plane_sums(const float* a, const float* b, int64_t N, int64_t C, int64_t HW, std::vector<double>& s,
                std::vector<double>& q) {
  s.assign(static_cast<size_t>(C), 0.0);
  q.assign(static_cast<size_t>(C), 0.0);
  parallel_for(C, N * C * HW, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t n = 0; n < N; ++n) {
        const int64_t o = (n * C + c) * HW;
        if (a == b) span_moments(a + o, HW, s[c], q[c]);
        else span_dot(a + o, b + o, HW, s[c], q[c]);
      }
  });
}

// The forward's affine map of one value, written once: the backward recomputes the fused
// activation's mask with it, and must get the forward's bits. The scale is gamma times the saved
// f32 invstd (bn_scale), so that the backward, which has only that, forms the same scale.
inline float bn_affine(float x, float mean, float scale, float beta) { return (x - mean) * scale + beta; }
inline float bn_scale(float invstd, float gamma) { return static_cast<float>(double(invstd) * gamma); }

// The gradient the backward loops sum and map, from dy (a) and x (b) of channel c: dy itself, or
// where an activation was fused without a residual, dy where the activation's derivative at the
// forward's output is nonzero, else 0 (a select, as relu.backward's loops: an infinite dy gives 0
// there, not NaN). The output is recomputed as the forward's loop formed it (bn_affine, the
// activation, rounding to T), so the mask is the one relu.backward would have read from y.
struct PassGradient {
  float operator()(float a, float, int64_t) const { return a; }
};
template <class T, class Act>
struct ActivationGate {
  const float *mean, *scale, *beta;
  float operator()(float a, float b, int64_t c) const {
    // The gate reads the normalised value u (rounded to T) instead of y = act(u): for relu and
    // relu6, the only activations fused here, the derivative is nonzero at y exactly where it is
    // at u (the clamps commute with rounding, and y in (0, 6) iff u is), and without the clamp
    // GCC vectorises the loop (with it, it branched per element: 7x slower, bench_ops).
    const float u = widen(narrow<T>(bn_affine(b, mean[c], scale[c], beta[c])));
    return Act::derivative(u, 0.0f) != 0.0f ? a : 0.0f;
  }
};
// f(gate) with the gate as a compile-time type, so that each variant stays one vectorisable loop.
template <class T, class F>
void with_gate(std::optional<Activation> act, const float* mean, const float* scale, const float* beta, F&& f) {
  if (!act) f(PassGradient{});
  else if (*act == Activation::relu) f(ActivationGate<T, ActivationFn<Activation::relu>>{mean, scale, beta});
  else if (*act == Activation::relu6) f(ActivationGate<T, ActivationFn<Activation::relu6>>{mean, scale, beta});
  else check_fused_activation("batch_norm_backward on backend 'cpu'", act);  // throws
}

// Per-channel sums over R rows of C of centred values: s = sum(a - ka), q = sum((a - ka) * (b - kb))
// (b == a, kb == ka: squares). Centring on a value near the mean (the caller's ka, kb) keeps the
// variance from cancelling digits, so the sums can be f32 over short runs: four rows are combined
// in registers, sixteen such sweeps accumulate in f32 (at most 64 terms), and that block is added
// to the thread's double accumulators. Threads take contiguous blocks of rows; their partials are
// added in thread order (deterministic for a given thread count).
template <class T, class Gate = PassGradient>
void row_sums(const T* a, const float* ka, const T* b, const float* kb, int64_t R, int64_t C, std::vector<double>& s,
              std::vector<double>& q, Gate gate = {}) {
  const int nt = R * C >= kParallelGrain ? static_cast<int>(std::min<int64_t>(max_threads(), R)) : 1;
  std::vector<double> part(static_cast<size_t>(nt * 2 * C), 0.0);
  std::vector<float> runs(static_cast<size_t>(nt * 2 * C));
#pragma omp parallel num_threads(nt) if (nt > 1)
  {
    const int t = omp_get_thread_num();
    int64_t r0, r1;
    split_range(R, omp_get_num_threads(), t, r0, r1);
    double* ps = part.data() + static_cast<size_t>(t) * 2 * C;
    double* pq = ps + C;
    float* fs = runs.data() + static_cast<size_t>(t) * 2 * C;
    float* fq = fs + C;
    constexpr int64_t kBlock = 64;
    for (int64_t blk = r0; blk < r1; blk += kBlock) {
      const int64_t end = std::min(blk + kBlock, r1);
      std::fill(fs, fs + 2 * C, 0.0f);
      int64_t r = blk;
      for (; r + 4 <= end; r += 4) {
        const T* a0 = a + r * C;
        const T* b0 = b + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float b0c = widen(b0[c]), b1c = widen(b0[C + c]), b2c = widen(b0[2 * C + c]),
                      b3c = widen(b0[3 * C + c]);
          const float u0 = gate(widen(a0[c]), b0c, c) - ka[c], u1 = gate(widen(a0[C + c]), b1c, c) - ka[c],
                      u2 = gate(widen(a0[2 * C + c]), b2c, c) - ka[c], u3 = gate(widen(a0[3 * C + c]), b3c, c) - ka[c];
          const float v0 = b0c - kb[c], v1 = b1c - kb[c], v2 = b2c - kb[c], v3 = b3c - kb[c];
          fs[c] += (u0 + u1) + (u2 + u3);
          fq[c] += (u0 * v0 + u1 * v1) + (u2 * v2 + u3 * v3);
        }
      }
      for (; r < end; ++r) {
        const T* ar = a + r * C;
        const T* br = b + r * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          const float bc = widen(br[c]);
          const float u = gate(widen(ar[c]), bc, c) - ka[c];
          fs[c] += u;
          fq[c] += u * (bc - kb[c]);
        }
      }
      for (int64_t c = 0; c < C; ++c) {
        ps[c] += fs[c];
        pq[c] += fq[c];
      }
    }
  }
  s.assign(static_cast<size_t>(C), 0.0);
  q.assign(static_cast<size_t>(C), 0.0);
  for (int t = 0; t < nt; ++t)
    for (int64_t c = 0; c < C; ++c) {
      s[c] += part[static_cast<size_t>(t * 2 * C + c)];
      q[c] += part[static_cast<size_t>(t * 2 * C + C + c)];
    }
}

// The loops' last step when no activation is fused (the activations' own value() takes its place).
struct NoActivation {
  static float value(float v, float) { return v; }
};

// f(res, act) with the residual flag (std::bool_constant) and the activation (NoActivation or
// scalar_math.h's ActivationFn) as compile-time constants, so that each variant of a loop below
// is its own branch-free, vectorisable loop.
template <class F>
void with_flags(bool res, std::optional<Activation> act, F&& f) {
  const auto with_res = [&](auto act_fn) {
    if (res) f(std::true_type{}, act_fn);
    else f(std::false_type{}, act_fn);
  };
  if (!act) with_res(NoActivation{});
  else if (*act == Activation::relu) with_res(ActivationFn<Activation::relu>{});
  else if (*act == Activation::relu6) with_res(ActivationFn<Activation::relu6>{});
  else check_fused_activation("batch_norm on backend 'cpu'", act);  // throws
}

// y = (x - mean[c]) * scale[c] + beta[c] over every plane, plus r (the residual) when there is
// one, then the activation (relu or relu6; NaN stays NaN). The mean is subtracted first, as oneDNN
// does: folded into one shift, x * scale + shift would cancel digits wherever the mean is large
// against the spread. The residual is added in the same pass: a ResNet block's bn, add and relu then read
// and write its output once instead of three times.
void affine_planes(const float* x, const float* r, float* y, int64_t N, int64_t C, int64_t HW, const float* mean,
                   const float* scale, const float* beta, std::optional<Activation> activation) {
  with_flags(r != nullptr, activation, [&](auto res, auto act) {
    parallel_for(N * C, N * C * HW, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const int64_t c = i % C;
        const float m = mean[c], a = scale[c], d = beta[c];
        const float* xp = x + i * HW;
        float* yp = y + i * HW;
        for (int64_t k = 0; k < HW; ++k) {
          float v = bn_affine(xp[k], m, a, d);
          if constexpr (decltype(res)::value) v += r[i * HW + k];
          v = decltype(act)::value(v, 0.0f);
          yp[k] = v;
        }
      }
    });
  });
}

// The same map over rows of C channels; x's rows lie ldx elements apart (C, or more for a slice of a
// wider tensor's channels), y's and the residual's C.
template <class T>
void affine_rows(const T* x, int64_t ldx, const T* r, T* y, int64_t R, int64_t C, const float* mean,
                 const float* scale, const float* beta, std::optional<Activation> activation) {
  with_flags(r != nullptr, activation, [&](auto res, auto act) {
    parallel_for(R, R * C, [&](int64_t b, int64_t e) {
      for (int64_t row = b; row < e; ++row) {
        const T* xr = x + row * ldx;
        T* yr = y + row * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          float v = bn_affine(widen(xr[c]), mean[c], scale[c], beta[c]);
          if constexpr (decltype(res)::value) v += widen(r[row * C + c]);
          v = decltype(act)::value(v, 0.0f);
          yr[c] = narrow<T>(v);
        }
      }
    });
  });
}

// dx = a[c] * dy + k[c] * (x - mean[c]) + d[c], plane by plane or row by row.
void dx_planes(const float* dy, const float* x, float* dx, int64_t N, int64_t C, int64_t HW, const float* mean,
               const float* a, const float* k, const float* d) {
  parallel_for(N * C, N * C * HW, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t c = i % C;
      const float ac = a[c], kc = k[c], dc = d[c], mc = mean[c];
      const float* xp = x + i * HW;
      const float* gp = dy + i * HW;
      float* op = dx + i * HW;
      for (int64_t j = 0; j < HW; ++j) op[j] = ac * gp[j] + kc * (xp[j] - mc) + dc;
    }
  });
}
template <class T, class Gate = PassGradient>
void dx_rows(const T* dy, const T* x, T* dx, int64_t R, int64_t C, const float* mean, const float* a, const float* k,
             const float* d, Gate gate = {}) {
  parallel_for(R, R * C, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const T* gr = dy + r * C;
      const T* xr = x + r * C;
      T* orow = dx + r * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float xc = widen(xr[c]);
        orow[c] = narrow<T>(a[c] * gate(widen(gr[c]), xc, c) + k[c] * (xc - mean[c]) + d[c]);
      }
    }
  });
}

// The backward's per-channel constants from sdy = sum(dy) and sdyxm = sum(dy * (x - mean)) over
// `count` values: dgamma = sum(dy * xhat), dbeta = sum(dy), and
// dx = gamma * invstd / m * (m * dy - sum(dy) - xhat * sum(dy * xhat)) folded into
// a*dy + k*(x - mean) + d.
struct BnBackwardCoeffs {
  std::vector<float> dg, db, a, k, d;
};
BnBackwardCoeffs bn_backward_coeffs(const std::vector<double>& sdy, const std::vector<double>& sdyxm, const float* g,
                                    const float* inv, double count) {
  const size_t C = sdy.size();
  BnBackwardCoeffs r{std::vector<float>(C), std::vector<float>(C), std::vector<float>(C), std::vector<float>(C),
                     std::vector<float>(C)};
  for (size_t c = 0; c < C; ++c) {
    const double sdy_xhat = sdyxm[c] * inv[c];
    r.dg[c] = static_cast<float>(sdy_xhat);
    r.db[c] = static_cast<float>(sdy[c]);
    const double kk = double(g[c]) * inv[c] / count;
    r.a[c] = static_cast<float>(kk * count);
    r.k[c] = static_cast<float>(-kk * sdy_xhat * inv[c]);
    r.d[c] = static_cast<float>(-kk * sdy[c]);
  }
  return r;
}

// The running statistics from the batch's mean and biased variance (engine/scalar_math.h has the rule).
void update_running_stats(const Tensor& running_mean, const Tensor& running_var, std::span<const float> mean,
                          std::span<const float> var, int64_t count, double momentum) {
  if (!running_mean.defined() || !running_var.defined()) return;
  float* rm = running_mean.data<float>();
  float* rv = running_var.data<float>();
  const int64_t sm = running_mean.stride(0), sv = running_var.stride(0);
  for (size_t c = 0; c < mean.size(); ++c) {
    const int64_t i = static_cast<int64_t>(c);
    rm[i * sm] = static_cast<float>(running_update(rm[i * sm], mean[c], momentum));
    rv[i * sv] = static_cast<float>(running_update(rv[i * sv], unbiased_var(var[c], count), momentum));
  }
}

// Which loop kernel takes a batch norm whose tensors all share x's layout: planes (f32 NCHW), rows
// (f32 or bf16 NHWC / [N, C]), or none (oneDNN then).
enum class BnLoops { none, planes, rows };
BnLoops bn_loops(const Tensor& x, std::initializer_list<const Tensor*> like_x) {
  BnLoops k = BnLoops::none;
  if (x.dtype() == DType::f32 && is_nchw(x)) k = BnLoops::planes;
  else if ((x.dtype() == DType::f32 || x.dtype() == DType::bf16) && is_rows(x)) k = BnLoops::rows;
  for (const Tensor* t : like_x)
    if (t->defined() && (t->dtype() != x.dtype() || t->shape() != x.shape() ||
                         !(k == BnLoops::planes ? t->is_contiguous() : is_rows(*t))))
      return BnLoops::none;
  return k;
}

// The profiler's implementation column for the loop kernels.
void note_loops(BnLoops k) {
  if (profiler::enabled()) profiler::note_impl(k == BnLoops::planes ? "duet:bn_nchw_planes" : "duet:bn_rows");
}

// f(T{}) with the row loops' element type: float, or half.h's BFloat16 for bf16 (widen() and
// narrow() convert, rounding to nearest even as every backend does).
template <class F>
void dispatch_f32_bf16(DType t, F&& f) {
  if (t == DType::bf16) f(BFloat16{});
  else f(float{});
}

}  // namespace

void CpuBackend::batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                            const Tensor& running_var, const Tensor& residual, const Tensor& y,
                            const Tensor& save_mean, const Tensor& save_invstd, const BatchNormParams& p) {
  // bf16 runs on oneDNN's primitive (bf16 data, f32 statistics and parameters).
  const int64_t C = x.size(1);
  const int64_t count = C > 0 ? x.numel() / C : 0;
  DUET_CHECK(p.training || (running_mean.defined() && running_var.defined()),
             "batch_norm on backend 'cpu': evaluation mode needs running_mean and running_var");
  if (x.numel() == 0) return;
  // A slice of a wider channels-last tensor's channels (eval mode, no residual: what
  // reads_channel_slices_in_batch_norm promises) runs the row loops with x's own row stride.
  const int64_t ldx = x.dim() == 4 ? channel_row_stride(x) : C;
  const bool slice = ldx > C;
  const bool slice_ok = slice && reads_channel_slices_in_batch_norm(x) && is_rows(y);
  const BnLoops slice_loops = slice_ok ? BnLoops::rows : BnLoops::none;
  DUET_CHECK(!slice || (!p.training && !residual.defined() && slice_loops == BnLoops::rows),
             "batch_norm on backend 'cpu': x {} with strides {} is a slice of a wider tensor's channels, which only "
             "eval mode without residual reads in place (f32 or bf16, y channels-last); got training={}, residual={}",
             shape_str(x.shape()), shape_str(x.strides()), p.training, residual.defined());
  if (const BnLoops loops = slice ? slice_loops : bn_loops(x, {&y, &residual}); loops != BnLoops::none) {
    note_loops(loops);
    const int64_t HW = x.dim() == 4 ? x.size(2) * x.size(3) : 1, N = x.size(0), R = N * HW;
    // The four per-channel vectors in one block: this runs for every batch norm of every pass.
    std::vector<float> gbuf, bbuf, stats(static_cast<size_t>(4 * C));
    const size_t n = static_cast<size_t>(C);
    const std::span<float> mean(stats.data(), n), var(mean.end(), n), invstd(var.end(), n), scale(invstd.end(), n);
    const float* g = contiguous_vec(gamma, gbuf);
    const float* b = contiguous_vec(beta, bbuf);
    if (p.training) {
      // Sums of x - shift and its square; the shift is 0 for the planes (double sums), the first
      // row for the rows (f32 runs, which need the centring).
      std::vector<double> s1, s2;
      std::vector<float> shift(static_cast<size_t>(C), 0.0f);
      if (loops == BnLoops::planes) plane_sums(x.data<float>(), x.data<float>(), N, C, HW, s1, s2);
      else dispatch_f32_bf16(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T* px = ptr<T>(x);
        for (int64_t c = 0; c < C; ++c) shift[c] = widen(px[c]);
        row_sums(px, shift.data(), px, shift.data(), R, C, s1, s2);
      });
      for (int64_t c = 0; c < C; ++c) {
        const double d = s1[c] / double(count);
        mean[c] = static_cast<float>(shift[c] + d);
        var[c] = static_cast<float>(std::max(0.0, s2[c] / double(count) - d * d));
      }
    } else {
      std::vector<float> mbuf, vbuf;
      const float* m = contiguous_vec(running_mean, mbuf);
      const float* v = contiguous_vec(running_var, vbuf);
      std::copy(m, m + C, mean.begin());
      std::copy(v, v + C, var.begin());
    }
    for (int64_t c = 0; c < C; ++c) {
      invstd[c] = static_cast<float>(inv_std(var[c], p.eps));
      scale[c] = bn_scale(invstd[c], g[c]);
    }
    if (loops == BnLoops::planes)
      affine_planes(x.data<float>(), residual.defined() ? residual.data<float>() : nullptr, y.data<float>(), N, C, HW,
                    mean.data(), scale.data(), b, p.act);
    else dispatch_f32_bf16(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      affine_rows(ptr<T>(x), ldx, residual.defined() ? ptr<T>(residual) : nullptr, ptr<T>(y), R, C,
                  mean.data(), scale.data(), b, p.act);
    });
    if (save_mean.defined()) store_vec(save_mean, mean.data());
    if (save_invstd.defined()) store_vec(save_invstd, invstd.data());
    if (p.training) update_running_stats(running_mean, running_var, mean, var, count, p.momentum);
    return;
  }
  // bf16 in a layout the rows do not take needs oneDNN's kernel (cpu_backend.cpp's support())
  if (x.dtype() == DType::bf16 && !onednn_computes_bf16())
    return reference_fallback("bf16 needs AVX-512 in oneDNN, this CPU has none")
        .batch_norm(x, gamma, beta, running_mean, running_var, residual, y, save_mean, save_invstd, p);
  guarded("batch_norm", {&x, &gamma, &beta}, [&] {
    DUET_CHECK(same_layout(x, y), "batch_norm on backend 'cpu': x and y must share a layout");
    const float eps = static_cast<float>(p.eps);
    // oneDNN fuses ReLU only, and before anything added after the primitive: with a residual,
    // or for ReLU6, the add and the activation are passes of their own (this path is for layouts
    // the loops do not take).
    const bool fuse_relu = p.act == Activation::relu && !residual.defined();
    Key key("bn_fwd");
    key.add(x).add(double(eps)).add(int64_t(p.training)).add(int64_t(fuse_relu));
    auto e = cached<BnFwd>(key, [&] {
      BnFwd r;
      r.x = md_of(x);
      r.y = r.x;  // same_layout: y differs at most in the strides of size-1 dims
      r.vec = dnnl::memory::desc({C}, dt::f32, tag::a);
      nf flags = nf::use_scale | nf::use_shift;
      if (!p.training) flags = flags | nf::use_global_stats;
      // oneDNN applies the ReLU in its normalisation pass. In training it also writes a bit mask
      // (the workspace) for its own fused backward; duet's backward masks the gradient with the
      // saved output instead (any backend can), so the mask goes to scratch memory.
      if (fuse_relu) flags = flags | nf::fuse_norm_relu;
      r.pd = bn_fwd_pd(r.x, eps, flags, p.training);
      r.prim = dnnl::batch_normalization_forward(r.pd);
      return r;
    });
    note(e->pd);
    std::vector<float> gbuf, bbuf, mbuf, vbuf;
    const float* g = contiguous_vec(gamma, gbuf);
    const float* b = contiguous_vec(beta, bbuf);
    ExecArgs args{{DNNL_ARG_SRC, mem(e->x, x)},
                  {DNNL_ARG_DST, mem(e->y, y)},
                  {DNNL_ARG_SCALE, mem(e->vec, const_cast<float*>(g))},
                  {DNNL_ARG_SHIFT, mem(e->vec, const_cast<float*>(b))}};
    if (p.training) {
      std::vector<float> mean(static_cast<size_t>(C)), var(static_cast<size_t>(C));
      args.add(DNNL_ARG_MEAN, mem(e->vec, mean.data()));
      args.add(DNNL_ARG_VARIANCE, mem(e->vec, var.data()));
      if (fuse_relu) {
        const dnnl::memory::desc ws = e->pd.workspace_desc();
        args.add(DNNL_ARG_WORKSPACE, mem(ws, scratch(ws.get_size(), 0)));
      }
      execute(e->prim, args);
      std::vector<float> invstd(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) invstd[c] = static_cast<float>(inv_std(var[c], p.eps));
      if (save_mean.defined()) store_vec(save_mean, mean.data());
      if (save_invstd.defined()) store_vec(save_invstd, invstd.data());
      // oneDNN normalises with the biased variance and gives it back; the running estimate is unbiased.
      update_running_stats(running_mean, running_var, mean, var, count, p.momentum);
    } else {
      const float* m = contiguous_vec(running_mean, mbuf);
      const float* v = contiguous_vec(running_var, vbuf);
      args.add(DNNL_ARG_MEAN, mem(e->vec, const_cast<float*>(m)));
      args.add(DNNL_ARG_VARIANCE, mem(e->vec, const_cast<float*>(v)));
      execute(e->prim, args);
      // The eval-mode gradient (written by the front-end with elementwise ops) reads these.
      std::vector<float> invstd(static_cast<size_t>(C));
      for (int64_t c = 0; c < C; ++c) invstd[c] = static_cast<float>(inv_std(v[c], p.eps));
      if (save_mean.defined()) store_vec(save_mean, m);
      if (save_invstd.defined()) store_vec(save_invstd, invstd.data());
    }
    if (residual.defined()) binary(BinaryOp::add, y, residual, y);
    if (p.act && !fuse_relu) activation(*p.act, 0.0, y, y);
  });
}

bool CpuBackend::reads_channel_slices_in_batch_norm(const Tensor& x) const {
  return (x.dtype() == DType::f32 || x.dtype() == DType::bf16) && channel_row_stride(x) > 0;
}

bool CpuBackend::fuses_batch_norm_activation_backward(const Tensor& x) const {
  return (x.dtype() == DType::f32 || x.dtype() == DType::bf16) && is_rows(x);
}

void CpuBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                     const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                     const Tensor& dgamma, const Tensor& dbeta, double eps /*in save_invstd, for the reference*/,
                                     std::optional<Activation> act) {
  const int64_t C = x.size(1);
  const BnLoops loops = bn_loops(x, {&dy, &dx});
  DUET_CHECK(!act || loops == BnLoops::rows,
             "batch_norm_backward on backend 'cpu': a fused {} needs x, dy and dx as rows of channels "
             "(channels-last or [N, C], f32 or bf16), got x {} with strides {}",
             activation_name(*act), shape_str(x.shape()), shape_str(x.strides()));
  if (x.numel() == 0) return;
  if (loops != BnLoops::none) {
    note_loops(loops);
    const int64_t HW = x.dim() == 4 ? x.size(2) * x.size(3) : 1, N = x.size(0), R = N * HW;
    std::vector<float> gbuf, bbuf, mbuf, ibuf;
    const float* g = contiguous_vec(gamma, gbuf);
    const float* m = contiguous_vec(save_mean, mbuf);
    const float* inv = contiguous_vec(save_invstd, ibuf);
    // With a fused activation the rows mask dy as they read it (ActivationGate), from the forward's
    // scale and shift.
    std::vector<float> scale(act ? static_cast<size_t>(C) : 0);
    const float* b = act ? contiguous_vec(beta, bbuf) : nullptr;
    for (size_t c = 0; c < scale.size(); ++c) scale[c] = bn_scale(inv[c], g[c]);
    // sum(dy) and sum(dy * (x - mean)): the planes sum dy * x in double and subtract, the rows
    // centre x on the mean as they go.
    std::vector<double> sdy, sdyxm;
    if (loops == BnLoops::planes) {
      plane_sums(dy.data<float>(), x.data<float>(), N, C, HW, sdy, sdyxm);
      for (int64_t c = 0; c < C; ++c) sdyxm[c] -= double(m[c]) * sdy[c];
    } else {
      const std::vector<float> zero(static_cast<size_t>(C), 0.0f);
      dispatch_f32_bf16(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        with_gate<T>(act, m, scale.data(), b,
                     [&](auto gate) { row_sums(ptr<T>(dy), zero.data(), ptr<T>(x), m, R, C, sdy, sdyxm, gate); });
      });
    }
    const BnBackwardCoeffs k = bn_backward_coeffs(sdy, sdyxm, g, inv, double(R));
    if (dx.defined()) {
      if (loops == BnLoops::planes)
        dx_planes(dy.data<float>(), x.data<float>(), dx.data<float>(), N, C, HW, m, k.a.data(), k.k.data(), k.d.data());
      else dispatch_f32_bf16(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        with_gate<T>(act, m, scale.data(), b, [&](auto gate) {
          dx_rows(ptr<T>(dy), ptr<T>(x), ptr<T>(dx), R, C, m, k.a.data(), k.k.data(), k.d.data(), gate);
        });
      });
    }
    if (dgamma.defined()) store_vec(dgamma, k.dg.data());
    if (dbeta.defined()) store_vec(dbeta, k.db.data());
    return;
  }
  if (x.dtype() == DType::bf16 && !onednn_computes_bf16())  // no fused activation: the check above
    return reference_fallback("bf16 needs AVX-512 in oneDNN, this CPU has none")
        .batch_norm_backward(dy, x, gamma, beta, save_mean, save_invstd, dx, dgamma, dbeta, eps, act);
  guarded("batch_norm_backward", {&dy, &x}, [&] {
    DUET_CHECK(same_layout(dy, x) && (!dx.defined() || same_layout(dx, x)),
               "batch_norm_backward on backend 'cpu': dy, x and dx must share a layout");
    Key key("bn_bwd");
    key.add(x);
    auto e = cached<BnBwd>(key, [&] {
      BnBwd r;
      r.x = md_of(x);
      r.dy = r.x;
      r.vec = dnnl::memory::desc({C}, dt::f32, tag::a);
      const nf flags = nf::use_scale | nf::use_shift;
      const auto hint = bn_fwd_pd(r.x, 0.f, flags, true);
      r.pd = dnnl::batch_normalization_backward::primitive_desc(
          dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, r.dy, r.x, 0.f, flags), engine(), hint);
      r.prim = dnnl::batch_normalization_backward(r.pd);
      return r;
    });
    note(e->pd);
    std::vector<float> gbuf, mbuf, ibuf;
    const float* g = contiguous_vec(gamma, gbuf);
    const float* m = contiguous_vec(save_mean, mbuf);
    const float* inv = contiguous_vec(save_invstd, ibuf);
    // oneDNN 2.6 insists on a SHIFT argument in backward with use_shift although the gradient
    // does not depend on it: a zero vector stands in for beta.
    std::vector<float> var(static_cast<size_t>(C)), dg(static_cast<size_t>(C)), db(static_cast<size_t>(C)),
        shift(static_cast<size_t>(C), 0.f);
    for (int64_t c = 0; c < C; ++c) var[c] = static_cast<float>(1.0 / (double(inv[c]) * double(inv[c])));
    void* dxp = dx.defined() ? dx.raw_data() : scratch(x.nbytes(), 3);
    execute(e->prim, {{DNNL_ARG_SRC, mem(e->x, x)},
                      {DNNL_ARG_DIFF_DST, mem(e->x, dy)},
                      {DNNL_ARG_MEAN, mem(e->vec, const_cast<float*>(m))},
                      {DNNL_ARG_VARIANCE, mem(e->vec, var.data())},
                      {DNNL_ARG_SCALE, mem(e->vec, const_cast<float*>(g))},
                      {DNNL_ARG_SHIFT, mem(e->vec, shift.data())},
                      {DNNL_ARG_DIFF_SRC, mem(e->x, dxp)},
                      {DNNL_ARG_DIFF_SCALE, mem(e->vec, dg.data())},
                      {DNNL_ARG_DIFF_SHIFT, mem(e->vec, db.data())}});
    if (dgamma.defined()) store_vec(dgamma, dg.data());
    if (dbeta.defined()) store_vec(dbeta, db.data());
  });
}

}  // namespace duet
