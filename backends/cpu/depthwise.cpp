// Depthwise convolution kernels for channels-last activations (see depthwise.h).
#include "backends/cpu/depthwise.h"
#include <algorithm>
#include <atomic>
#include "backends/cpu/common.h"
#include "engine/half.h"

namespace duet::cpu {

namespace {

std::atomic<KernelPolicy> g_policy{KernelPolicy::automatic};

// Everything the loops need, in elements. Activations are addressed as base + n*sN + h*sH + w*sW
// + c (channel stride 1), which covers NHWC and the [N, C, 1, 1] tensors whose spatial strides
// never matter.
struct Geometry {
  int64_t N, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw;
  int64_t xN, xH, xW;  // strides of the input-side tensor (x or dx)
  int64_t yN, yH, yW;  // strides of the output-side tensor (y or dy)
};

Geometry geometry(const Tensor& in, const Tensor& out, const Tensor& w, const Conv2dParams& p) {
  return {in.size(0),    in.size(1),    in.size(2),    in.size(3),    out.size(2),  out.size(3),
          w.size(2),     w.size(3),     p.stride_h,    p.stride_w,    p.pad_h,      p.pad_w,
          p.dilation_h,  p.dilation_w,  in.stride(0),  in.stride(2),  in.stride(3), out.stride(0),
          out.stride(2), out.stride(3)};
}

// The weights [C, 1, KH, KW] (any strides) as [KH][KW][C] in f32: one contiguous channel vector
// per tap.
template <class S>
std::vector<float> taps_of(const Tensor& w) {
  const int64_t C = w.size(0), KH = w.size(2), KW = w.size(3);
  std::vector<float> t(static_cast<size_t>(KH * KW * C));
  const S* pw = ptr<S>(w);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw)
        t[static_cast<size_t>((kh * KW + kw) * C + c)] = widen(pw[c * w.stride(0) + kh * w.stride(2) + kw * w.stride(3)]);
  return t;
}

// Sums run in f32 rows of C. An f32 output row is its own accumulator; a bf16 one gets a
// per-thread f32 row, rounded into the output once it is complete.
template <class S>
struct RowAccumulator {
  std::vector<float> buf;
  explicit RowAccumulator(int64_t C) : buf(std::is_same_v<S, float> ? 0 : static_cast<size_t>(C)) {}
  float* row(S* out) {
    if constexpr (std::is_same_v<S, float>) return out;
    else return buf.data();
  }
  void store(const float* acc, S* out, int64_t C) {
    if constexpr (!std::is_same_v<S, float>) {
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = narrow<S>(acc[c]);
    }
  }
};

// Calls f(S{}) with the storage type of t: float or BFloat16 (depthwise_applicable admits no other).
template <class F>
void dispatch_storage(const Tensor& t, F&& f) {
  if (t.dtype() == DType::bf16) f(BFloat16{});
  else f(float{});
}

bool channels_contiguous(const Tensor& t) { return t.dim() == 4 && (t.size(1) == 1 || t.stride(1) == 1); }

}  // namespace

void set_depthwise_policy(KernelPolicy p) { g_policy.store(p); }
KernelPolicy depthwise_policy() { return g_policy.load(); }

bool depthwise_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return (x.dtype() == DType::f32 || x.dtype() == DType::bf16) && w.dtype() == x.dtype() && y.dtype() == x.dtype() &&
         x.dim() == 4 && w.dim() == 4 && p.groups > 1 && p.groups == x.size(1) &&
         w.size(0) == p.groups && w.size(1) == 1 && channels_contiguous(x) && channels_contiguous(y);
}

namespace {

// A per-channel vector of f32 or bf16 (a bias or its gradient), element c.
float channel_value(const Tensor& t, int64_t c) {
  return t.dtype() == DType::bf16 ? widen(ptr<BFloat16>(t)[c * t.stride(0)]) : t.data<float>()[c * t.stride(0)];
}
void set_channel_value(const Tensor& t, int64_t c, float v) {
  if (t.dtype() == DType::bf16) ptr<BFloat16>(t)[c * t.stride(0)] = narrow<BFloat16>(v);
  else t.data<float>()[c * t.stride(0)] = v;
}

template <class S>
void forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  const Geometry g = geometry(x, y, w, p);
  const std::vector<float> taps = taps_of<S>(w);
  std::vector<float> b(static_cast<size_t>(g.C), 0.f);
  if (bias.defined())
    for (int64_t c = 0; c < g.C; ++c) b[static_cast<size_t>(c)] = channel_value(bias, c);
  const S* px = ptr<S>(x);
  S* py = ptr<S>(y);
  const int64_t C = g.C;
  parallel_for(g.N * g.OH, y.numel() * g.KH * g.KW, [&](int64_t r0, int64_t r1) {
    RowAccumulator<S> rows(C);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        S* dst = py + n * g.yN + oh * g.yH + ow * g.yW;
        float* out = rows.row(dst);
        std::copy(b.begin(), b.end(), out);
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t iw = ow * g.sw - g.pw + kw * g.dw;
            if (iw < 0 || iw >= g.W) continue;
            const S* in = px + n * g.xN + ih * g.xH + iw * g.xW;
            const float* tap = taps.data() + (kh * g.KW + kw) * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) out[c] += widen(in[c]) * tap[c];
          }
        }
        rows.store(out, dst, C);
      }
    }
  });
}

template <class S>
void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  const Geometry g = geometry(dx, dy, w, p);
  const std::vector<float> taps = taps_of<S>(w);
  const S* pdy = ptr<S>(dy);
  S* pdx = ptr<S>(dx);
  const int64_t C = g.C;
  // Gather form: each input position sums the outputs its taps reached, so no two threads write
  // the same element.
  parallel_for(g.N * g.H, dx.numel() * g.KH * g.KW, [&](int64_t r0, int64_t r1) {
    RowAccumulator<S> rows(C);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / g.H, ih = r % g.H;
      for (int64_t iw = 0; iw < g.W; ++iw) {
        S* dst = pdx + n * g.xN + ih * g.xH + iw * g.xW;
        float* out = rows.row(dst);
        std::fill(out, out + C, 0.f);
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t th = ih + g.ph - kh * g.dh;
          if (th < 0 || th % g.sh != 0 || th / g.sh >= g.OH) continue;
          const int64_t oh = th / g.sh;
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t tw = iw + g.pw - kw * g.dw;
            if (tw < 0 || tw % g.sw != 0 || tw / g.sw >= g.OW) continue;
            const S* grad = pdy + n * g.yN + oh * g.yH + (tw / g.sw) * g.yW;
            const float* tap = taps.data() + (kh * g.KW + kw) * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) out[c] += widen(grad[c]) * tap[c];
          }
        }
        rows.store(out, dst, C);
      }
    }
  });
}

template <class S>
void backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias, const Conv2dParams& p) {
  const Geometry g = geometry(x, dy, dw, p);
  const int64_t C = g.C, taps = g.KH * g.KW;
  const int64_t rows = g.N * g.OH;
  const int parts = static_cast<int>(
      std::min<int64_t>(rows, dy.numel() * taps < kParallelGrain ? 1 : max_threads()));
  // Per-chunk f32 partial sums [taps * C weights | C bias], added up in chunk order afterwards:
  // the result depends on the thread count, never on timing.
  const int64_t width = (taps + 1) * C;
  std::vector<float> partial(static_cast<size_t>(parts * width), 0.f);
  const S* px = ptr<S>(x);
  const S* pdy = ptr<S>(dy);
  const auto chunk = [&](int part) {
    int64_t r0, r1;
    split_range(rows, parts, part, r0, r1);
    float* acc = partial.data() + part * width;
    float* acc_b = acc + taps * C;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t n = r / g.OH, oh = r % g.OH;
      for (int64_t ow = 0; ow < g.OW; ++ow) {
        const S* grad = pdy + n * g.yN + oh * g.yH + ow * g.yW;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) acc_b[c] += widen(grad[c]);
        for (int64_t kh = 0; kh < g.KH; ++kh) {
          const int64_t ih = oh * g.sh - g.ph + kh * g.dh;
          if (ih < 0 || ih >= g.H) continue;
          for (int64_t kw = 0; kw < g.KW; ++kw) {
            const int64_t iw = ow * g.sw - g.pw + kw * g.dw;
            if (iw < 0 || iw >= g.W) continue;
            const S* in = px + n * g.xN + ih * g.xH + iw * g.xW;
            float* a = acc + (kh * g.KW + kw) * C;
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) a[c] += widen(grad[c]) * widen(in[c]);
          }
        }
      }
    }
  };
  if (parts == 1) {
    chunk(0);
  } else {
#pragma omp parallel for num_threads(parts) schedule(static, 1)
    for (int part = 0; part < parts; ++part) chunk(part);
  }
  for (int part = 1; part < parts; ++part) {
    const float* src = partial.data() + part * width;
    float* dst = partial.data();
#pragma omp simd
    for (int64_t i = 0; i < width; ++i) dst[i] += src[i];
  }
  S* pdw = ptr<S>(dw);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw)
        pdw[c * dw.stride(0) + kh * dw.stride(2) + kw * dw.stride(3)] =
            narrow<S>(partial[static_cast<size_t>((kh * g.KW + kw) * C + c)]);
  if (dbias.defined())
    for (int64_t c = 0; c < C; ++c) set_channel_value(dbias, c, partial[static_cast<size_t>(taps * C + c)]);
}

}  // namespace

void depthwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  dispatch_storage(x, [&](auto tag) { forward<decltype(tag)>(x, w, bias, y, p); });
}

void depthwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  dispatch_storage(dy, [&](auto tag) { backward_data<decltype(tag)>(dy, w, dx, p); });
}

void depthwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                               const Conv2dParams& p) {
  dispatch_storage(x, [&](auto tag) { backward_weight<decltype(tag)>(x, dy, dw, dbias, p); });
}

}  // namespace duet::cpu
