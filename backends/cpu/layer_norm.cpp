// Layer norm on the cpu backend: the forward is oneDNN's primitive (jit AVX-512) with separate
// scale and shift, its biased variance turned into duet's rstd by a short loop; the backward is an
// OpenMP loop over rows (below, with the measurement that chose it). Batch norm is batch_norm.cpp.
#include <cmath>
#include "backends/cpu/common.h"
#include "backends/cpu/norm_common.h"
#include "engine/scalar_math.h"

namespace duet {
using namespace cpu;

namespace {

using nf = dnnl::normalization_flags;

struct LnFwd {
  dnnl::layer_normalization_forward::primitive_desc pd;
  dnnl::layer_normalization_forward prim;
  dnnl::memory::desc data, stat, vec;
};

nf ln_flags(bool scale, bool shift) {
  nf f = nf::none;
  if (scale) f = f | nf::use_scale;
  if (shift) f = f | nf::use_shift;
  return f;
}

}  // namespace

void CpuBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                            const Tensor& mean, const Tensor& rstd, double eps) {
  const int64_t D = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = D > 0 ? x.numel() / D : 0;
  if (rows == 0 || D == 0) return;
  guarded("layer_norm", {&x, &gamma, &beta}, [&] {
    DUET_CHECK(x.is_contiguous() && y.is_contiguous(), "layer_norm on backend 'cpu': x and y must be contiguous");
    const bool has_g = gamma.defined(), has_b = beta.defined();
    Key key("ln_fwd");
    key.add(rows).add(D).add(eps).add(int64_t(has_g)).add(int64_t(has_b));
    auto e = cached<LnFwd>(key, [&] {
      LnFwd r;
      r.data = dnnl::memory::desc({rows, D}, dt::f32, tag::ab);
      r.stat = dnnl::memory::desc({rows}, dt::f32, tag::a);
      r.vec = dnnl::memory::desc({D}, dt::f32, tag::a);
      r.pd = dnnl::layer_normalization_forward::primitive_desc(
          dnnl::layer_normalization_forward::desc(dnnl::prop_kind::forward_training, r.data, r.stat,
                                                  static_cast<float>(eps), ln_flags(has_g, has_b)),
          engine());
      r.prim = dnnl::layer_normalization_forward(r.pd);
      return r;
    });
    note(e->pd);
    std::vector<float> gbuf, bbuf, mean_buf;
    float* var = static_cast<float*>(scratch(static_cast<size_t>(rows) * sizeof(float), 4));
    float* mp = mean.defined() && mean.is_contiguous() ? mean.data<float>()
                                                       : (mean_buf.resize(static_cast<size_t>(rows)), mean_buf.data());
    ExecArgs args{{DNNL_ARG_SRC, mem(e->data, x)},
                  {DNNL_ARG_DST, mem(e->data, y)},
                  {DNNL_ARG_MEAN, mem(e->stat, mp)},
                  {DNNL_ARG_VARIANCE, mem(e->stat, var)}};
    if (has_g) args.add(DNNL_ARG_SCALE, mem(e->vec, const_cast<float*>(contiguous_vec(gamma, gbuf))));
    if (has_b) args.add(DNNL_ARG_SHIFT, mem(e->vec, const_cast<float*>(contiguous_vec(beta, bbuf))));
    execute(e->prim, args);
    if (mean.defined() && !mean.is_contiguous()) store_vec(mean, mp);
    if (rstd.defined()) {
      float* pr = rstd.data<float>();
      const int64_t sr = rstd.dim() == 0 ? 0 : rstd.stride(0);
      parallel_for(rows, rows * 8, [&](int64_t b, int64_t en) {
        for (int64_t i = b; i < en; ++i) pr[i * sr] = static_cast<float>(inv_std(var[i], eps));
      });
    }
  });
}

// Layer norm backward is an OpenMP loop over rows: oneDNN 2.6's reference-grade
// simple_layer_normalization backward measured 4-5x slower than PyTorch on ViT shapes, while the
// row-wise formula is two short vectorised passes per row (D = 192 fits in L1):
//   dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),  g = dy * gamma,  xhat = (x - mean) * rstd
// and dgamma/dbeta are column sums kept per thread in double and added at the end.
namespace {

struct LayerNormBackwardArgs {
  const float *x, *dy, *mean, *rstd, *gamma;  // gamma may be null
  float* dx;                                  // may be null
  double *dgamma, *dbeta;                     // this thread's column sums, or null
  int64_t D;
};

// Rows [r0, r1): xhat = (x - mean) rstd, g = dy gamma, dx = rstd (g - mean(g) - xhat mean(g xhat)),
// column sums of dy xhat and dy. The row sums are `omp simd` reductions (vector partial sums; a
// plain float loop stays scalar without reassociation), in SIMD clones. The column sums run in
// f32 over blocks of kColumnBlock rows and go to the double totals once a block: widening every
// element to double took as long as the rest of the row's work.
constexpr int64_t kColumnBlock = 16;
DUET_SIMD_CLONES void layer_norm_backward_rows(const LayerNormBackwardArgs& a, int64_t r0, int64_t r1, float* scratch) {
  const int64_t D = a.D;
  float* __restrict xh = scratch;
  float* __restrict gg = scratch + D;
  float* __restrict fdg = scratch + 2 * D;  // this block's column sums
  float* __restrict fdb = scratch + 3 * D;
  const auto flush = [&] {
    double* __restrict dg = a.dgamma;
    double* __restrict db = a.dbeta;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) {
      dg[d] += double(fdg[d]);
      db[d] += double(fdb[d]);
      fdg[d] = 0.0f;
      fdb[d] = 0.0f;
    }
  };
  if (a.dgamma) std::fill(fdg, fdg + 2 * D, 0.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* __restrict xr = a.x + r * D;
    const float* __restrict dyr = a.dy + r * D;
    const float m = a.mean[r], rs = a.rstd[r];
    float sg = 0.f, sgx = 0.f;
    if (a.gamma) {
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t d = 0; d < D; ++d) {
        const float xv = (xr[d] - m) * rs, gv = dyr[d] * a.gamma[d];
        xh[d] = xv;
        gg[d] = gv;
        sg += gv;
        sgx += gv * xv;
      }
    } else {
#pragma omp simd reduction(+ : sg, sgx)
      for (int64_t d = 0; d < D; ++d) {
        const float xv = (xr[d] - m) * rs, gv = dyr[d];
        xh[d] = xv;
        gg[d] = gv;
        sg += gv;
        sgx += gv * xv;
      }
    }
    if (a.dgamma) {
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) {
        fdg[d] += dyr[d] * xh[d];
        fdb[d] += dyr[d];
      }
      if ((r - r0) % kColumnBlock == kColumnBlock - 1) flush();
    }
    if (a.dx) {
      const float mg = sg / float(D), mgx = sgx / float(D);
      float* __restrict o = a.dx + r * D;
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) o[d] = rs * (gg[d] - mg - xh[d] * mgx);
    }
  }
  if (a.dgamma) flush();
}

}  // namespace

void CpuBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                     const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t D = x.dim() == 0 ? 1 : x.size(-1);
  const int64_t rows = D > 0 ? x.numel() / D : 0;
  if (D == 0) return;
  DUET_CHECK(x.is_contiguous() && dy.is_contiguous() && (!dx.defined() || dx.is_contiguous()),
             "layer_norm_backward on backend 'cpu': dy, x and dx must be contiguous");
  DUET_CHECK(mean.is_contiguous() && rstd.is_contiguous(),
             "layer_norm_backward on backend 'cpu': mean and rstd must be contiguous");
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  const float* pm = mean.data<float>();
  const float* pr = rstd.data<float>();
  float* pdx = dx.defined() ? dx.data<float>() : nullptr;
  std::vector<float> gbuf;
  const float* pg = gamma.defined() ? contiguous_vec(gamma, gbuf) : nullptr;
  const bool want_cols = dgamma.defined() || dbeta.defined();
  const int nt = max_threads();
  std::vector<double> cols(want_cols ? static_cast<size_t>(nt) * 2 * D : 0, 0.0);
  parallel_for(rows, rows * D * 4, [&](int64_t r0, int64_t r1) {
    const int t = omp_in_parallel() ? omp_get_thread_num() : 0;
    double* dg = want_cols ? cols.data() + static_cast<size_t>(t) * 2 * D : nullptr;
    std::vector<float> scratch(static_cast<size_t>(4 * D));
    layer_norm_backward_rows({px, pdy, pm, pr, pg, pdx, dg, want_cols ? dg + D : nullptr, D}, r0, r1, scratch.data());
  });
  if (!want_cols) return;
  for (int64_t d = 0; d < D; ++d) {
    double sdg = 0.0, sdb = 0.0;
    for (int t = 0; t < nt; ++t) {
      sdg += cols[static_cast<size_t>(t) * 2 * D + d];
      sdb += cols[static_cast<size_t>(t) * 2 * D + D + d];
    }
    if (dgamma.defined()) dgamma.data<float>()[d * dgamma.stride(0)] = static_cast<float>(sdg);
    if (dbeta.defined()) dbeta.data<float>()[d * dbeta.stride(0)] = static_cast<float>(sdb);
  }
}

}  // namespace duet
