// Depthwise convolution kernels for channels-last activations (see depthwise.h).
#include "backends/cpu/depthwise.h"
#include <algorithm>
#include <atomic>
#include <cstring>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_kernels.h"
#include "engine/frozen_copies.h"
#include "engine/half.h"

namespace duet::cpu {

namespace {

std::atomic<KernelPolicy> g_policy{policy_from_env("DUET_DEPTHWISE")};

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

// The weights [C, 1, KH, KW] (any strides) in f32 as [KH][KW] rows of `row` >= C floats at t: one
// contiguous channel vector per tap (floats C to row of each are left as they are).
template <class S>
void write_taps(const Tensor& w, float* t, int64_t row) {
  const int64_t C = w.size(0), KH = w.size(2), KW = w.size(3);
  const S* pw = ptr<S>(w);
  const int64_t sc = w.stride(0), skh = w.stride(2), skw = w.stride(3);  // (Tensor::stride is a call)
  for (int64_t c = 0; c < C; ++c)
    for (int64_t kh = 0; kh < KH; ++kh)
      for (int64_t kw = 0; kw < KW; ++kw) t[(kh * KW + kw) * row + c] = widen(pw[c * sc + kh * skh + kw * skw]);
}
template <class S>
std::vector<float> taps_of(const Tensor& w) {
  std::vector<float> t(static_cast<size_t>(w.size(2) * w.size(3) * w.size(0)));
  write_taps<S>(w, t.data(), w.size(0));
  return t;
}

// 16 f32 lanes as one value (a GCC/Clang vector type): one AVX-512 register, two AVX2 ones, ...
typedef float Lanes __attribute__((vector_size(64)));
constexpr int64_t kLanes = 16;
constexpr int kTapGroup = 8;  // kernel columns accumulated in the weight gradient's registers at once

inline Lanes load_lanes(const float* p) {
  Lanes v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline Lanes load_lanes(const BFloat16* p) {
  typedef uint16_t Bits16 __attribute__((vector_size(32)));
  typedef uint32_t Bits32 __attribute__((vector_size(64)));
  Bits16 h;
  std::memcpy(&h, p, sizeof h);
  const Bits32 w = __builtin_convertvector(h, Bits32) << 16;  // bf16 is the top half of an f32
  Lanes v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
// The last block of a channel count that is not a multiple of 16: the missing lanes read as 0.
template <bool Full, class S>
Lanes load_block(const S* p, int64_t nc) {
  if constexpr (Full) {
    return load_lanes(p);
  } else {
    S tmp[kLanes] = {};
    std::copy(p, p + nc, tmp);
    return load_lanes(tmp);
  }
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

// Element c of a per-channel vector of f32 or bf16 (a bias gradient).
void set_channel_value(const Tensor& t, int64_t c, float v) {
  if (t.dtype() == DType::bf16) ptr<BFloat16>(t)[c * t.stride(0)] = narrow<BFloat16>(v);
  else t.data<float>()[c * t.stride(0)] = v;
}

// ---- forward ---------------------------------------------------------------------------------------
// y[n, oh, ow, c] = bias[c] + sum over the taps in reach of x[n, ih, iw, c] * w[c, kh, kw], then the
// epilogue. Each work item is one output row of one 16-channel block, whose sums stay in registers a
// few pixels at a time: one load of x per tap and one store per output (an output-row array swept
// once per tap, as the data gradient's loop does, paid a load and a store per multiply-add and ran
// MobileNetV2's [1, 960, 1, 1] layer in 15 us against oneDNN's 5).

// The weights as tap-major rows of f32 channels, [KH * KW][Cp], Cp = C rounded up to whole 16-lane
// blocks (zeros after C), so that every block's loads are whole. A frozen weight's are made once per
// freeze and kept (engine/frozen_copies.h): a frozen model's forwards read them as they are. Any
// other weight's are made at every call.
int64_t padded_channels(int64_t C) { return (C + kLanes - 1) / kLanes * kLanes; }

template <class S>
Tensor forward_taps(const Tensor& w) {
  const int64_t KH = w.size(2), KW = w.size(3), Cp = padded_channels(w.size(0));
  const auto make = [&] {
    Tensor t = Tensor::empty({KH * KW * Cp});  // (not zeros(): that would be an op of its own)
    float* pt = t.data<float>();
    std::fill(pt, pt + KH * KW * Cp, 0.f);
    write_taps<S>(w, pt, Cp);
    return t;
  };
  return w.is_frozen() ? frozen_copy(w, "duet depthwise: taps", make) : make();
}

template <bool Full, class S>
void store_block(S* dst, Lanes v, int64_t nc) {
  if constexpr (std::is_same_v<S, float> && Full) {
    std::memcpy(dst, &v, sizeof v);
  } else {
    float tmp[kLanes];
    std::memcpy(tmp, &v, sizeof v);
    for (int64_t l = 0; l < (Full ? kLanes : nc); ++l) dst[l] = narrow<S>(tmp[l]);
  }
}

// Output pixels summed at once in registers: 8 x 16 lanes fill a quarter of AVX-512's registers;
// AVX2 holds each in two of its sixteen. Summing one pixel at a time instead leaves a chain of
// dependent multiply-adds per pixel (2.6x slower than oneDNN on MobileNetV2's 144 x 16 x 16 layer).
#if defined(__AVX512F__)
constexpr int kPixelBlock = 8;
#else
constexpr int kPixelBlock = 4;
#endif

// Outputs [ow0, ow0 + M) of one row and one channel block: the M sums stay in registers while each
// tap is loaded once. Edge = false promises that every tap of these outputs lands inside the row
// (no column bounds to test); rows outside the input are skipped either way.
template <int M, bool Edge, bool Full, class S>
void forward_pixels(const Geometry& g, const S* px, const float* taps, Lanes b, int64_t Cp, const StoreEpilogue& epi,
                    S* py, int64_t n, int64_t oh, int64_t ow0, int64_t c0, int64_t nc) {
  Lanes acc[M];
  for (int j = 0; j < M; ++j) acc[j] = b;
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    const int64_t ih = conv_in_index(oh, kh, g.sh, g.ph, g.dh);
    if (ih < 0 || ih >= g.H) continue;
    const S* xrow = px + n * g.xN + ih * g.xH + c0;
    const float* trow = taps + kh * g.KW * Cp + c0;
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const Lanes tap = load_lanes(trow + kw * Cp);
      const int64_t iw0 = conv_in_index(ow0, kw, g.sw, g.pw, g.dw);
#pragma GCC unroll 8
      for (int j = 0; j < M; ++j) {
        const int64_t iw = iw0 + j * g.sw;
        if (!Edge || (iw >= 0 && iw < g.W)) acc[j] += load_block<Full>(xrow + iw * g.xW, nc) * tap;
      }
    }
  }
  for (int j = 0; j < M; ++j) {
    const int64_t at = n * g.yN + oh * g.yH + (ow0 + j) * g.yW + c0;
    // In the order conv_epilogue_passes would run them after the kernel: the residual, then relu or
    // relu6, whose clamps both let a NaN through as the passes' activations do.
    Lanes v = acc[j];
    if (epi.residual) v += load_block<Full>(epi.residual + at, nc);
    if (epi.relu) v = v < 0.f ? Lanes{} : v;
    if (epi.relu6) v = 6.f < v ? Lanes{} + 6.f : v;
    store_block<Full>(py + at, v, nc);
  }
}

// One output row of one 16-channel block. The outputs some tap of which falls off the row (one at
// each end for a 3x3 kernel with padding 1) are summed one by one with bounds tests; the interior
// kPixelBlock at a time without, and its last m < kPixelBlock together.
template <bool Full, class S>
void forward_row_block(const Geometry& g, const S* px, const float* taps, const float* bias, int64_t Cp,
                       const StoreEpilogue& epi, S* py, int64_t n, int64_t oh, int64_t c0, int64_t nc) {
  const Lanes b = load_lanes(bias + c0);
  // The interior [lo, hi): ow * sw - pw >= 0 and ow * sw - pw + (KW - 1) * dw <= W - 1.
  const int64_t lo = std::min(g.OW, (g.pw + g.sw - 1) / g.sw);
  const int64_t last = g.W - 1 + g.pw - (g.KW - 1) * g.dw;
  const int64_t hi = std::max(lo, last < 0 ? lo : std::min(g.OW, last / g.sw + 1));
  const auto edge = [&](int64_t ow) { forward_pixels<1, true, Full>(g, px, taps, b, Cp, epi, py, n, oh, ow, c0, nc); };
  for (int64_t ow = 0; ow < lo; ++ow) edge(ow);
  int64_t ow = lo;
  for (; ow + kPixelBlock <= hi; ow += kPixelBlock)
    forward_pixels<kPixelBlock, false, Full>(g, px, taps, b, Cp, epi, py, n, oh, ow, c0, nc);
  const auto tail = [&](auto m) {
    forward_pixels<decltype(m)::value, false, Full>(g, px, taps, b, Cp, epi, py, n, oh, ow, c0, nc);
  };
  switch (hi - ow) {  // 0 to kPixelBlock - 1
    case 1: tail(std::integral_constant<int, 1>{}); break;
    case 2: tail(std::integral_constant<int, 2>{}); break;
    case 3: tail(std::integral_constant<int, 3>{}); break;
    case 4: tail(std::integral_constant<int, 4>{}); break;
    case 5: tail(std::integral_constant<int, 5>{}); break;
    case 6: tail(std::integral_constant<int, 6>{}); break;
    case 7: tail(std::integral_constant<int, 7>{}); break;
    default: break;
  }
  for (ow = hi; ow < g.OW; ++ow) edge(ow);
}

// The bias (or zeros) widened to f32 and padded with zeros to Cp channels. Its pointer and stride
// are read once: per element, Tensor's calls cost more than a whole 1x1 layer's sums.
std::vector<float> padded_bias(const Tensor& bias, int64_t C, int64_t Cp) {
  std::vector<float> b(static_cast<size_t>(Cp), 0.f);
  if (!bias.defined()) return b;
  const int64_t s = bias.stride(0);
  if (bias.dtype() == DType::bf16) {
    const BFloat16* p = ptr<BFloat16>(bias);
    for (int64_t c = 0; c < C; ++c) b[static_cast<size_t>(c)] = widen(p[c * s]);
  } else {
    const float* p = bias.data<float>();
    for (int64_t c = 0; c < C; ++c) b[static_cast<size_t>(c)] = p[c * s];
  }
  return b;
}

template <class S>
void forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p,
             const StoreEpilogue& epi) {
  const Geometry g = geometry(x, y, w, p);
  const int64_t Cp = padded_channels(g.C), blocks = Cp / kLanes;
  const Tensor taps = forward_taps<S>(w);
  const std::vector<float> b = padded_bias(bias, g.C, Cp);
  const float* pt = taps.data<float>();
  const S* px = ptr<S>(x);
  S* py = ptr<S>(y);
  parallel_for(g.N * g.OH * blocks, y.numel() * g.KH * g.KW, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t r = i / blocks, n = r / g.OH, oh = r % g.OH, c0 = (i % blocks) * kLanes;
      const int64_t nc = std::min(kLanes, g.C - c0);
      if (nc == kLanes) forward_row_block<true>(g, px, pt, b.data(), Cp, epi, py, n, oh, c0, nc);
      else forward_row_block<false>(g, px, pt, b.data(), Cp, epi, py, n, oh, c0, nc);
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

// ---- weight gradient -----------------------------------------------------------------------------
// dw[c, kh, kw] = sum over n, oh, ow of dy[n, oh, ow, c] * x[n, ih, iw, c]. Work is cut into
// 16-channel blocks; for each output row and kernel row, up to 8 taps of that kernel row are
// accumulated in registers across the whole row (one load of dy per pixel, one load of x per tap)
// and written back once per row. (Sweeping a taps x C accumulator array per pixel instead, three
// loads and a store per multiply-add, ran ConvNeXt's 7x7 gradients at 21-33 GFLOP/s.)

// One work item: channels [c0, c0 + nc), kernel columns [kw0, kw0 + G), images [n0, n1). acc holds
// KH x G lane sums, accb the bias gradient's (or is null).
template <class S, int G, bool Full>
void weight_grad_item(const Geometry& g, const S* px, const S* pdy, int64_t c0, int64_t nc, int64_t kw0, int64_t n0,
                      int64_t n1, Lanes* acc, Lanes* accb) {
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t oh = 0; oh < g.OH; ++oh) {
      const S* grow = pdy + n * g.yN + oh * g.yH + c0;
      if (accb) {
        Lanes b = *accb;
        for (int64_t ow = 0; ow < g.OW; ++ow) b += load_block<Full>(grow + ow * g.yW, nc);
        *accb = b;
      }
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = conv_in_index(oh, kh, g.sh, g.ph, g.dh);
        if (ih < 0 || ih >= g.H) continue;
        const S* xrow = px + n * g.xN + ih * g.xH + c0;
        Lanes a[G];
        for (int j = 0; j < G; ++j) a[j] = acc[kh * G + j];
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const Lanes gv = load_block<Full>(grow + ow * g.yW, nc);
          const int64_t iw0 = conv_in_index(ow, kw0, g.sw, g.pw, g.dw);
#pragma GCC unroll 8
          for (int j = 0; j < G; ++j) {
            const int64_t iw = iw0 + j * g.dw;
            if (iw >= 0 && iw < g.W) a[j] += gv * load_block<Full>(xrow + iw * g.xW, nc);
          }
        }
        for (int j = 0; j < G; ++j) acc[kh * G + j] = a[j];
      }
    }
}

template <class S, int G>
void weight_grad_item(bool full, const Geometry& g, const S* px, const S* pdy, int64_t c0, int64_t nc, int64_t kw0,
                      int64_t n0, int64_t n1, Lanes* acc, Lanes* accb) {
  if (full) weight_grad_item<S, G, true>(g, px, pdy, c0, nc, kw0, n0, n1, acc, accb);
  else weight_grad_item<S, G, false>(g, px, pdy, c0, nc, kw0, n0, n1, acc, accb);
}

template <class S>
void backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias, const Conv2dParams& p) {
  const Geometry g = geometry(x, dy, dw, p);
  const int64_t C = g.C;
  const int64_t blocks = (C + kLanes - 1) / kLanes, groups = (g.KW + kTapGroup - 1) / kTapGroup;
  // Images are split into parts only when blocks x groups leave threads idle; the parts' sums are
  // added in part order, so the result depends on the thread count, never on timing.
  const int64_t base = blocks * groups, threads = max_threads();
  const int64_t parts = std::clamp<int64_t>((2 * threads + base - 1) / base, 1, g.N);
  const int64_t slot = g.KH * std::min<int64_t>(g.KW, kTapGroup) + 1;  // lanes per item: KH x G taps, then the bias
  std::vector<Lanes> acc(static_cast<size_t>(base * parts * slot), Lanes{});
  const S* px = ptr<S>(x);
  const S* pdy = ptr<S>(dy);
  parallel_for(base * parts, dy.numel() * g.KH * g.KW, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t part = i % parts, q = (i / parts) % groups, b = i / (parts * groups);
      const int64_t c0 = b * kLanes, nc = std::min(kLanes, C - c0), kw0 = q * kTapGroup;
      int64_t n0, n1;
      split_range(g.N, static_cast<int>(parts), static_cast<int>(part), n0, n1);
      Lanes* a = acc.data() + i * slot;
      Lanes* ab = q == 0 ? a + slot - 1 : nullptr;
      const bool full = nc == kLanes;
      switch (std::min<int64_t>(kTapGroup, g.KW - kw0)) {
        case 1: weight_grad_item<S, 1>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        case 2: weight_grad_item<S, 2>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        case 3: weight_grad_item<S, 3>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        case 4: weight_grad_item<S, 4>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        case 5: weight_grad_item<S, 5>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        case 6: weight_grad_item<S, 6>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        case 7: weight_grad_item<S, 7>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
        default: weight_grad_item<S, 8>(full, g, px, pdy, c0, nc, kw0, n0, n1, a, ab); break;
      }
    }
  });
  S* pdw = ptr<S>(dw);
  const int64_t sc = dw.stride(0), skh = dw.stride(2), skw = dw.stride(3);  // (Tensor::stride is a call)
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t q = 0; q < groups; ++q) {
      Lanes* sum = acc.data() + (b * groups + q) * parts * slot;
      for (int64_t part = 1; part < parts; ++part)
        for (int64_t k = 0; k < slot; ++k) sum[k] += sum[part * slot + k];
      const int64_t c0 = b * kLanes, nc = std::min(kLanes, C - c0), kw0 = q * kTapGroup;
      const int64_t G = std::min<int64_t>(kTapGroup, g.KW - kw0);
      for (int64_t l = 0; l < nc; ++l) {
        const int64_t c = c0 + l;
        for (int64_t kh = 0; kh < g.KH; ++kh)
          for (int64_t j = 0; j < G; ++j)
            pdw[c * sc + kh * skh + (kw0 + j) * skw] = narrow<S>(sum[kh * G + j][l]);
        if (q == 0 && dbias.defined()) set_channel_value(dbias, c, sum[slot - 1][l]);
      }
    }
}

}  // namespace

void depthwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                       const Conv2dParams& p) {
  const StoreEpilogue in_store = store_epilogue(y, residual, p.act, /*clamps_at_6=*/true);
  dispatch_storage(x, [&](auto tag) { forward<decltype(tag)>(x, w, bias, y, p, in_store); });
  finish_store_epilogue(in_store, y, residual, p.act);
}

void depthwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  dispatch_storage(dy, [&](auto tag) { backward_data<decltype(tag)>(dy, w, dx, p); });
}

void depthwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                               const Conv2dParams& p) {
  dispatch_storage(x, [&](auto tag) { backward_weight<decltype(tag)>(x, dy, dw, dbias, p); });
}

}  // namespace duet::cpu
