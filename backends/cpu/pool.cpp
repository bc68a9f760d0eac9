// Pooling on the cpu backend: oneDNN pooling primitives (jit AVX-512) on the tensors' own
// NCHW/NHWC strides. Max-pool backward scatters dy through oneDNN's argmax workspace (u8 window
// offsets laid out like y): in training the forward writes it into the op's indices tensor, which
// autograd keeps instead of x and y. Without indices (windows of more than 256 positions), the
// backward reruns a training forward into scratch to get the workspace first. Average pooling whose
// ceil-mode windows overhang the padded border (PyTorch clips that divisor, oneDNN does not) and
// adaptive pooling are OpenMP loops.
#include <algorithm>
#include <cmath>
#include "backends/cpu/common.h"
#include "engine/half.h"
#include "engine/scalar_math.h"

namespace duet {
using namespace cpu;

namespace {

// Sizes and (canonical, see md_of) strides of an N-C-H-W tensor, so that the NHWC fast paths
// below also take [N, C, 1, 1] maps whatever strides their size-1 dims carry.
struct V4 {
  int64_t N, C, H, W, sN, sC, sH, sW;
  explicit V4(const Tensor& t) : V4(t, canonical_strides(t)) {}
  V4(const Tensor& t, const Shape& s)
      : N(t.size(0)), C(t.size(1)), H(t.size(2)), W(t.size(3)), sN(s[0]), sC(s[1]), sH(s[2]), sW(s[3]) {}
  int64_t at(int64_t n, int64_t c, int64_t h, int64_t w) const { return n * sN + c * sC + h * sH + w * sW; }
};

struct PoolGeometry {
  dims strides, kernel, pad_l, pad_r;
  bool overhang;  // some window reaches past the right/bottom padding (ceil mode)
};

PoolGeometry pool_geometry(const Pool2dParams& p, const Tensor& x, const Tensor& y) {
  const int64_t H = x.size(2), W = x.size(3), OH = y.size(2), OW = y.size(3);
  const int64_t rh = (OH - 1) * p.stride_h + p.kernel_h - H - p.pad_h;
  const int64_t rw = (OW - 1) * p.stride_w + p.kernel_w - W - p.pad_w;
  return {{p.stride_h, p.stride_w},
          {p.kernel_h, p.kernel_w},
          {p.pad_h, p.pad_w},
          {std::max(p.pad_h, rh), std::max(p.pad_w, rw)},
          rh > p.pad_h || rw > p.pad_w};
}

struct PoolFwd {
  dnnl::pooling_forward::primitive_desc pd;
  dnnl::pooling_forward prim;
  dnnl::memory::desc x, y;
};
struct PoolBwd {
  dnnl::pooling_backward::primitive_desc pd;
  dnnl::pooling_backward prim;
  dnnl::memory::desc dy, dx;
};
// Max pooling backward: a training-mode forward (to get oneDNN's argmax workspace) and the
// backward that scatters dy through it.
struct MaxPoolBwd {
  dnnl::pooling_forward::primitive_desc fwd_pd;
  dnnl::pooling_forward fwd;
  dnnl::pooling_backward::primitive_desc pd;
  dnnl::pooling_backward prim;
  dnnl::memory::desc x, y, dy, dx;
};

Key pool_key(const char* tag, const Tensor& a, const Tensor& b, const Pool2dParams& p) {
  Key k(tag);
  k.add(a).add(b).add(p.kernel_h).add(p.kernel_w).add(p.stride_h).add(p.stride_w).add(p.pad_h).add(p.pad_w);
  k.add(int64_t(p.count_include_pad)).add(int64_t(p.ceil_mode));
  return k;
}

dnnl::pooling_forward::primitive_desc pool_fwd_pd(dnnl::algorithm alg, const dnnl::memory::desc& x,
                                                  const dnnl::memory::desc& y, const PoolGeometry& g,
                                                  dnnl::prop_kind prop) {
  return dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(prop, alg, x, y, g.strides, g.kernel, g.pad_l, g.pad_r), engine());
}

void pool_forward(const char* op, dnnl::algorithm alg, const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  guarded(op, {&x, &y}, [&] {
    auto e = cached<PoolFwd>(pool_key(op, x, y, p), [&] {
      PoolFwd r;
      r.x = md_of(x);
      r.y = md_of(y);
      r.pd = pool_fwd_pd(alg, r.x, r.y, pool_geometry(p, x, y), dnnl::prop_kind::forward_inference);
      r.prim = dnnl::pooling_forward(r.pd);
      return r;
    });
    note(e->pd);
    execute(e->prim, {{DNNL_ARG_SRC, mem(e->x, x)}, {DNNL_ARG_DST, mem(e->y, y)}});
  });
}

dnnl::algorithm avg_alg(const Pool2dParams& p) {
  return p.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                             : dnnl::algorithm::pooling_avg_exclude_padding;
}

// ---- loops -----------------------------------------------------------------------------------------

// Parallel over (n, c) planes: windows of different planes never write the same dx element.
template <class F>
void for_each_plane(int64_t N, int64_t C, int64_t work, F f) {
  parallel_for(N * C, work, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(i / C, i % C);
  });
}

// Windows, divisors and adaptive bins are engine/scalar_math.h's, shared with the other backends.

template <class T>
void zero4(const Tensor& t) {
  // dense (nchw or nhwc): one flat span
  T* p = static_cast<T*>(t.raw_data());
  parallel_for(t.numel(), t.numel(), [&](int64_t b, int64_t e) { std::fill(p + b, p + e, T(0)); });
}

template <class T>
void avg_pool_loop(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  const V4 X(x), Y(y);
  const T* px = static_cast<const T*>(x.raw_data());
  T* py = static_cast<T*>(y.raw_data());
  for_each_plane(X.N, X.C, x.numel() + y.numel() * p.kernel_h * p.kernel_w, [&](int64_t n, int64_t c) {
    for (int64_t oh = 0; oh < Y.H; ++oh)
      for (int64_t ow = 0; ow < Y.W; ++ow) {
        const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
        if (win.h0 >= win.h1 || win.w0 >= win.w1) {
          py[Y.at(n, c, oh, ow)] = T(0);
          continue;
        }
        double sum = 0.0;
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) sum += px[X.at(n, c, h, w)];
        py[Y.at(n, c, oh, ow)] = static_cast<T>(sum / double(avg_divisor(p, oh, ow, X.H, X.W)));
      }
  });
}

template <class T>
void avg_pool_backward_loop(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  const V4 DY(dy), DX(dx);
  const T* pdy = static_cast<const T*>(dy.raw_data());
  T* pdx = static_cast<T*>(dx.raw_data());
  zero4<T>(dx);
  for_each_plane(DX.N, DX.C, dx.numel() + dy.numel() * p.kernel_h * p.kernel_w, [&](int64_t n, int64_t c) {
    for (int64_t oh = 0; oh < DY.H; ++oh)
      for (int64_t ow = 0; ow < DY.W; ++ow) {
        const PoolWindow win = pool_window(p, oh, ow, DX.H, DX.W);
        if (win.h0 >= win.h1 || win.w0 >= win.w1) continue;
        const T g = static_cast<T>(double(pdy[DY.at(n, c, oh, ow)]) / double(avg_divisor(p, oh, ow, DX.H, DX.W)));
        for (int64_t h = win.h0; h < win.h1; ++h)
          for (int64_t w = win.w0; w < win.w1; ++w) pdx[DX.at(n, c, h, w)] += g;
      }
  });
}


// acc[c] += img[i * C + c] over HW rows of C (one NHWC image), full-width in the SIMD clones.
template <class W, class S>
DUET_SIMD_CLONES void add_pixels(W* __restrict acc, const S* __restrict img, int64_t HW, int64_t C) {
  for (int64_t i = 0; i < HW; ++i) {
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) acc[c] += widen(img[i * C + c]);
  }
}

// S is the storage type (float, double or BFloat16); sums run in widen(S) or double and each
// result is rounded to S once.
template <class S>
void adaptive_forward(const Tensor& x, const Tensor& y) {
  using W = decltype(widen(S{}));
  const V4 X(x), Y(y);
  const S* px = ptr<S>(x);
  S* py = ptr<S>(y);
  const int64_t HW = X.H * X.W;
  if (Y.H == 1 && Y.W == 1 && X.sC == 1 && X.sW == X.C && X.sH == X.W * X.C && HW <= 4096) {
    // Global pooling of NHWC: per image, add the HW channel rows into one C-vector (vectorised).
    // Accumulates in W: a global pool adds HW values (49 for a 7x7 map, 16 for CIFAR's 4x4),
    // far below where f32 rounding matters; double lanes would halve the vector width.
    parallel_for(X.N, x.numel(), [&](int64_t b, int64_t e) {
      std::vector<W> acc(static_cast<size_t>(X.C));
      for (int64_t n = b; n < e; ++n) {
        std::fill(acc.begin(), acc.end(), W(0));
        add_pixels(acc.data(), px + n * X.sN, HW, X.C);
        for (int64_t c = 0; c < X.C; ++c) py[Y.at(n, c, 0, 0)] = narrow<S>(double(acc[c]) / double(HW));
      }
    });
    return;
  }
  for_each_plane(X.N, X.C, x.numel(), [&](int64_t n, int64_t c) {
    for (int64_t oh = 0; oh < Y.H; ++oh)
      for (int64_t ow = 0; ow < Y.W; ++ow) {
        const int64_t h0 = bin_start(oh, X.H, Y.H), h1 = bin_end(oh, X.H, Y.H);
        const int64_t w0 = bin_start(ow, X.W, Y.W), w1 = bin_end(ow, X.W, Y.W);
        double sum = 0.0;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) sum += widen(px[X.at(n, c, h, w)]);
        py[Y.at(n, c, oh, ow)] = narrow<S>(sum / double((h1 - h0) * (w1 - w0)));
      }
  });
}

template <class S>
void adaptive_backward(const Tensor& dy, const Tensor& dx) {
  const V4 DY(dy), DX(dx);
  const S* pdy = ptr<S>(dy);
  S* pdx = ptr<S>(dx);
  if (DY.H == 1 && DY.W == 1) {
    // Global pooling: every input position of (n, c) receives dy[n, c] / HW.
    const double inv = 1.0 / double(DX.H * DX.W);
    if (DX.sC == 1 && DX.sW == DX.C && DX.sH == DX.W * DX.C) {
      parallel_for(DX.N * DX.H * DX.W, dx.numel(), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const int64_t n = i / (DX.H * DX.W);
          S* row = pdx + i * DX.C;
          for (int64_t c = 0; c < DX.C; ++c) row[c] = narrow<S>(double(widen(pdy[DY.at(n, c, 0, 0)])) * inv);
        }
      });
      return;
    }
    for_each_plane(DX.N, DX.C, dx.numel(), [&](int64_t n, int64_t c) {
      const S g = narrow<S>(double(widen(pdy[DY.at(n, c, 0, 0)])) * inv);
      for (int64_t h = 0; h < DX.H; ++h)
        for (int64_t w = 0; w < DX.W; ++w) pdx[DX.at(n, c, h, w)] = g;
    });
    return;
  }
  // Bins may overlap (input sizes the output does not divide): each input position sums the
  // shares of every bin that holds it, in double, and is rounded once.
  for_each_plane(DX.N, DX.C, dx.numel() + dy.numel(), [&](int64_t n, int64_t c) {
    for (int64_t h = 0; h < DX.H; ++h)
      for (int64_t w = 0; w < DX.W; ++w) {
        const PoolRange rh = bins_containing(h, DX.H, DY.H), rw = bins_containing(w, DX.W, DY.W);
        double g = 0.0;
        for (int64_t oh = rh.begin; oh <= rh.end; ++oh) {
          const int64_t h0 = bin_start(oh, DX.H, DY.H), h1 = bin_end(oh, DX.H, DY.H);
          if (h < h0 || h >= h1) continue;
          for (int64_t ow = rw.begin; ow <= rw.end; ++ow) {
            const int64_t w0 = bin_start(ow, DX.W, DY.W), w1 = bin_end(ow, DX.W, DY.W);
            if (w < w0 || w >= w1) continue;
            g += double(widen(pdy[DY.at(n, c, oh, ow)])) / double((h1 - h0) * (w1 - w0));
          }
        }
        pdx[DX.at(n, c, h, w)] = narrow<S>(g);
      }
  });
}

}  // namespace

// The workspace must be the indices tensor itself: u8, y's shape and strides.
void check_workspace(const dnnl::memory::desc& ws, const dnnl::memory::desc& indices) {
  DUET_CHECK(ws == indices, "max_pool2d on backend 'cpu': oneDNN's argmax workspace is not laid out like the output "
             "({} bytes); expected u8 in the output's layout",
             ws.get_size());
}

void CpuBackend::max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  if (y.numel() == 0) return;
  if (!indices.defined()) return pool_forward("max_pool2d", dnnl::algorithm::pooling_max, x, y, p);
  guarded("max_pool2d", {&x, &y}, [&] {
    auto e = cached<PoolFwd>(pool_key("max_pool2d_train", x, y, p), [&] {
      PoolFwd r;
      r.x = md_of(x);
      r.y = md_of(y);
      r.pd = pool_fwd_pd(dnnl::algorithm::pooling_max, r.x, r.y, pool_geometry(p, x, y), dnnl::prop_kind::forward_training);
      check_workspace(r.pd.workspace_desc(), md_of(indices));
      r.prim = dnnl::pooling_forward(r.pd);
      return r;
    });
    note(e->pd);
    execute(e->prim, {{DNNL_ARG_SRC, mem(e->x, x)},
                      {DNNL_ARG_DST, mem(e->y, y)},
                      {DNNL_ARG_WORKSPACE, mem(e->pd.workspace_desc(), indices.raw_data())}});
  });
}

void CpuBackend::max_pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& indices, const Tensor& dy,
                                     const Tensor& dx, const Pool2dParams& p) {
  // oneDNN 2.6 scattered bf16 gradients to wrong positions for a 17x17 window on channels-last
  // maps without a kept argmax (found by the op table's bf16 cases); such windows are no model's.
  if (dy.dtype() == DType::bf16 && !indices.defined())
    return reference_fallback("bf16 max pooling without a kept argmax (windows over 256 positions)")
        .max_pool2d_backward(x, y, indices, dy, dx, p);
  if (dx.numel() == 0) return;
  guarded("max_pool2d_backward", {&dy, &dx}, [&] {
    auto e = cached<MaxPoolBwd>(pool_key(indices.defined() ? "max_pool2d_bwd_ws" : "max_pool2d_bwd", dx, dy, p), [&] {
      MaxPoolBwd r;
      r.dy = md_of(dy);
      r.dx = md_of(dx);
      // The backward's hint: a training forward on dx's and dy's layouts (x and y share them).
      r.x = r.dx;
      r.y = r.dy;
      const PoolGeometry g = pool_geometry(p, dx, dy);
      r.fwd_pd = pool_fwd_pd(dnnl::algorithm::pooling_max, r.x, r.y, g, dnnl::prop_kind::forward_training);
      if (indices.defined()) check_workspace(r.fwd_pd.workspace_desc(), md_of(indices));
      else r.fwd = dnnl::pooling_forward(r.fwd_pd);
      r.pd = dnnl::pooling_backward::primitive_desc(
          dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, r.dx, r.dy, g.strides, g.kernel, g.pad_l, g.pad_r),
          engine(), r.fwd_pd);
      r.prim = dnnl::pooling_backward(r.pd);
      return r;
    });
    note(e->pd);
    const auto ws_md = e->fwd_pd.workspace_desc();
    dnnl::memory ws;
    if (indices.defined()) {
      ws = mem(ws_md, indices.raw_data());
    } else {
      ws = mem(ws_md, scratch(ws_md.get_size(), 3));
      dnnl::memory ym = mem(e->y, scratch(e->y.get_size(), 4));  // recomputed y, discarded
      execute(e->fwd, {{DNNL_ARG_SRC, mem(e->x, x)}, {DNNL_ARG_DST, ym}, {DNNL_ARG_WORKSPACE, ws}});
    }
    execute(e->prim, {{DNNL_ARG_DIFF_DST, mem(e->dy, dy)}, {DNNL_ARG_WORKSPACE, ws}, {DNNL_ARG_DIFF_SRC, mem(e->dx, dx)}});
  });
}

void CpuBackend::avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  if (y.numel() == 0) return;
  if (p.count_include_pad && pool_geometry(p, x, y).overhang) {
    if (x.dtype() != DType::f32) return reference_fallback("ceil-mode windows past the padding in bf16").avg_pool2d(x, y, p);
    return avg_pool_loop<float>(x, y, p);
  }
  pool_forward(p.count_include_pad ? "avg_pool2d_incl" : "avg_pool2d", avg_alg(p), x, y, p);
}

void CpuBackend::avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  if (dx.numel() == 0) return;
  if (p.count_include_pad && pool_geometry(p, dx, dy).overhang) {
    if (dy.dtype() != DType::f32)
      return reference_fallback("ceil-mode windows past the padding in bf16").avg_pool2d_backward(dy, dx, p);
    return avg_pool_backward_loop<float>(dy, dx, p);
  }
  guarded("avg_pool2d_backward", {&dy, &dx}, [&] {
    auto e = cached<PoolBwd>(pool_key("avg_pool2d_bwd", dy, dx, p), [&] {
      PoolBwd r;
      r.dy = md_of(dy);
      r.dx = md_of(dx);
      const PoolGeometry g = pool_geometry(p, dx, dy);
      const auto hint = pool_fwd_pd(avg_alg(p), r.dx, r.dy, g, dnnl::prop_kind::forward_training);
      r.pd = dnnl::pooling_backward::primitive_desc(
          dnnl::pooling_backward::desc(avg_alg(p), r.dx, r.dy, g.strides, g.kernel, g.pad_l, g.pad_r), engine(), hint);
      r.prim = dnnl::pooling_backward(r.pd);
      return r;
    });
    note(e->pd);
    execute(e->prim, {{DNNL_ARG_DIFF_DST, mem(e->dy, dy)}, {DNNL_ARG_DIFF_SRC, mem(e->dx, dx)}});
  });
}

// f16 adaptive pooling runs on the reference loops; f32, f64 and bf16 on the loops above.
void CpuBackend::adaptive_avg_pool2d(const Tensor& x, const Tensor& y) {
  if (x.dtype() == DType::bf16) return adaptive_forward<BFloat16>(x, y);
  dispatch_float(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) { adaptive_forward<decltype(tag)>(x, y); });
}

void CpuBackend::adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx) {
  if (dy.dtype() == DType::bf16) return adaptive_backward<BFloat16>(dy, dx);
  dispatch_float(dy.dtype(), "adaptive_avg_pool2d_backward", [&](auto tag) { adaptive_backward<decltype(tag)>(dy, dx); });
}

}  // namespace duet
