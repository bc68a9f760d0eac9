// duet's own direct convolution (direct_conv.h): an implicit matrix product on channels-last f32
// maps with an AVX2 + FMA register tile of 6 output pixels by 16 output channels.
#include "backends/cpu/direct_conv.h"
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_kernels.h"
#include "backends/cpu/planner.h"
#include "backends/cpu/skinny_gemm.h"
#include "backends/cpu/small_gemm.h"

namespace duet::cpu {

namespace {

constexpr int kMR = 6;   // output pixels per register tile
constexpr int kNR = 16;  // output channels per register tile: two ymm vectors
// Input channels per chunk of the sum are at most this many; a padded tap reads this many zeros.
constexpr int64_t kMaxChunk = 1024;
alignas(64) const float kZeros[kMaxChunk] = {};

// The sizes the loops need, in elements.
struct Geometry {
  int64_t N, C, H, W, O, OH, OW, KH, KW, sh, sw, ph, pw, dh, dw;
  int64_t taps() const { return KH * KW; }
  int64_t pixels() const { return N * OH * OW; }
  // Input channels per chunk: the sum over K = taps x C runs in chunks of about 1,152 products
  // (128 channels of a 3x3 kernel) so that one panel of packed weights (72 KiB) stays in L2 while
  // every pixel tile of a block reads it; the partial sums wait in y between chunks. Chunks of 288
  // and 576 products were no faster on AMD Zen 3 (bench/conv_candidates.py, within its noise).
  int64_t chunk() const {
    const int64_t want = std::clamp<int64_t>(1152 / taps(), 8, kMaxChunk);
    return C <= want ? std::max<int64_t>(C, 1) : want;
  }
  int64_t chunks() const { return std::max<int64_t>(1, (C + chunk() - 1) / chunk()); }
  int64_t channel_tiles() const { return (O + kNR - 1) / kNR; }
};

// x [N, C, H, W] convolved into y [N, O, OH, OW] by a KHxKW kernel with parameters p.
Geometry geometry(const Tensor& x, const Tensor& y, int64_t KH, int64_t KW, const Conv2dParams& p) {
  return {x.size(0), x.size(1), x.size(2), x.size(3), y.size(1), y.size(2), y.size(3), KH, KW,
          p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w};
}

// Where weight (o, c, kh, kw) of the convolution lies: base + o*so + c*sc + kh*skh + kw*skw. The
// forward reads w [O, C, KH, KW] through its strides; a data gradient reads the same memory turned
// 180 degrees with its two channel dimensions swapped (negative tap strides), so the flipped
// weights are packed straight from w, with no flipped copy between.
struct WeightView {
  const float* base;
  int64_t so, sc, skh, skw;
};
WeightView forward_weights(const Tensor& w) { return {w.data<float>(), w.stride(0), w.stride(1), w.stride(2), w.stride(3)}; }
WeightView flipped_weights(const Tensor& w) {
  const int64_t KH = w.size(2), KW = w.size(3);
  return {w.data<float>() + (KH - 1) * w.stride(2) + (KW - 1) * w.stride(3), w.stride(1), w.stride(0), -w.stride(2),
          -w.stride(3)};
}

// The weights in the order the kernel reads them: for each 16-channel tile of O, for each chunk of
// C, for each tap, for each input channel of the chunk, the 16 output channels' weights (zeros
// past O). A tile's panel for chunk c starts at c * chunk * taps * 16.
void pack_weights(const WeightView& v, const Geometry& g, float* dst) {
  const float* src = v.base;
  const int64_t s0 = v.so, s1 = v.sc, s2 = v.skh, s3 = v.skw;
  const int64_t taps = g.taps(), kc = g.chunk(), tile = taps * g.C * kNR;
  // Each output channel's weights are read along c, where they lie close together (a row of a
  // [O, C] matrix, or 9 floats apart in [O, C, 3, 3]), and written 16 floats apart into the tile's
  // panel, which stays in L1/L2: reading across the 16 channels instead (each 4 C floats apart or
  // more) made packing a 160 x 960 matrix cost as much as the product it feeds.
  parallel_for(g.channel_tiles(), g.channel_tiles() * tile, [&](int64_t b, int64_t e) {
    for (int64_t ot = b; ot < e; ++ot) {
      float* panel = dst + ot * tile;
      for (int64_t c0 = 0; c0 < g.C; c0 += kc) {
        const int64_t n_c = std::min(kc, g.C - c0);
        for (int64_t t = 0; t < taps; ++t) {
          float* out = panel + (c0 * taps + t * n_c) * kNR;
          const float* tap = src + c0 * s1 + (t / g.KW) * s2 + (t % g.KW) * s3;
          for (int64_t j = 0; j < kNR; ++j) {
            const int64_t o = ot * kNR + j;
            if (o < g.O)
              for (int64_t c = 0; c < n_c; ++c) out[c * kNR + j] = tap[o * s0 + c * s1];
            else
              for (int64_t c = 0; c < n_c; ++c) out[c * kNR + j] = 0.0f;
          }
        }
      }
    }
  });
}

// How the 12 accumulators of a tile start, and where they go.
struct TileIo {
  float* y;             // the tile's first pixel at its first output channel; pixel rows ldy apart
  int64_t ldy;          // O
  int nvalid;           // output channels of the 16 that exist (1..16)
  const float* bias;    // 16 floats (padded), added when the sum starts; null: none or not the first chunk
  const float* res;     // the residual at y's offset (rows ldy apart), added when the sum ends; null: none
  bool first, last, relu;
  bool relu6;           // with relu: min(6, v) after it
};

// MR output pixels by 16 output channels over one chunk of the sum: a[t * MR + m] points at pixel
// m's input channels of this chunk through tap t (or at zeros), wp at the chunk's weight panel.
template <int MR>
__attribute__((noinline)) DUET_AVX2_FMA void tile_kernel(const float* const* a, int64_t taps, int64_t kc, const float* wp, const TileIo& io) {
  __m256 c0[MR], c1[MR];
  const __m256i lanes_lo = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i lanes_hi = _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15);
  const __m256i n = _mm256_set1_epi32(io.nvalid);
  const __m256i m0 = _mm256_cmpgt_epi32(n, lanes_lo), m1 = _mm256_cmpgt_epi32(n, lanes_hi);
  const bool full = io.nvalid == kNR;
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) {
    if (!io.first) {
      const float* yr = io.y + m * io.ldy;
      c0[m] = full ? _mm256_loadu_ps(yr) : _mm256_maskload_ps(yr, m0);
      c1[m] = full ? _mm256_loadu_ps(yr + 8) : _mm256_maskload_ps(yr + 8, m1);
    } else if (io.bias != nullptr) {
      c0[m] = _mm256_loadu_ps(io.bias);
      c1[m] = _mm256_loadu_ps(io.bias + 8);
    } else {
      c0[m] = c1[m] = _mm256_setzero_ps();
    }
  }
  for (int64_t t = 0; t < taps; ++t) {
    const float* ap[MR];
#pragma GCC unroll 6
    for (int m = 0; m < MR; ++m) ap[m] = a[t * MR + m];
    for (int64_t i = 0; i < kc; ++i, wp += kNR) {
      const __m256 b0 = _mm256_loadu_ps(wp), b1 = _mm256_loadu_ps(wp + 8);
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) {
        const __m256 v = _mm256_broadcast_ss(ap[m] + i);
        c0[m] = _mm256_fmadd_ps(v, b0, c0[m]);
        c1[m] = _mm256_fmadd_ps(v, b1, c1[m]);
      }
    }
  }
  const __m256 zero = _mm256_setzero_ps(), six = _mm256_set1_ps(6.0f);
#pragma GCC unroll 6
  for (int m = 0; m < MR; ++m) {
    float* yr = io.y + m * io.ldy;
    if (io.last && io.res != nullptr) {
      const float* rr = io.res + m * io.ldy;
      c0[m] = _mm256_add_ps(c0[m], full ? _mm256_loadu_ps(rr) : _mm256_maskload_ps(rr, m0));
      c1[m] = _mm256_add_ps(c1[m], full ? _mm256_loadu_ps(rr + 8) : _mm256_maskload_ps(rr + 8, m1));
    }
    if (io.last && io.relu) {  // max(0, v) returns v when v is NaN, as the reference's relu does
      c0[m] = _mm256_max_ps(zero, c0[m]);
      c1[m] = _mm256_max_ps(zero, c1[m]);
    }
    if (io.last && io.relu6) {  // min(6, v) likewise
      c0[m] = _mm256_min_ps(six, c0[m]);
      c1[m] = _mm256_min_ps(six, c1[m]);
    }
    if (full) {
      _mm256_storeu_ps(yr, c0[m]);
      _mm256_storeu_ps(yr + 8, c1[m]);
    } else {
      _mm256_maskstore_ps(yr, m0, c0[m]);
      _mm256_maskstore_ps(yr + 8, m1, c1[m]);
    }
  }
}

void run_tile(int mr, const float* const* a, int64_t taps, int64_t kc, const float* wp, const TileIo& io) {
  switch (mr) {
    case 6: return tile_kernel<6>(a, taps, kc, wp, io);
    case 5: return tile_kernel<5>(a, taps, kc, wp, io);
    case 4: return tile_kernel<4>(a, taps, kc, wp, io);
    case 3: return tile_kernel<3>(a, taps, kc, wp, io);
    case 2: return tile_kernel<2>(a, taps, kc, wp, io);
    default: return tile_kernel<1>(a, taps, kc, wp, io);
  }
}

// Where each of mr pixels from p0 reads input channel c0 through each tap: a[t * mr + m].
void tap_pointers(const Geometry& g, const float* x, int64_t p0, int mr, int64_t c0, const float** a) {
  for (int m = 0; m < mr; ++m) {
    const int64_t p = p0 + m, n = p / (g.OH * g.OW), oh = p / g.OW % g.OH, ow = p % g.OW;
    for (int64_t kh = 0; kh < g.KH; ++kh)
      for (int64_t kw = 0; kw < g.KW; ++kw) {
        const int64_t ih = conv_in_index(oh, kh, g.sh, g.ph, g.dh), iw = conv_in_index(ow, kw, g.sw, g.pw, g.dw);
        const bool inside = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
        a[(kh * g.KW + kw) * mr + m] = inside ? x + ((n * g.H + ih) * g.W + iw) * g.C + c0 : kZeros;
      }
  }
}

// Each thread gets one region of the output: a share of the pixel tiles with every channel tile, or
// (where that balances better: few pixels, many channels) every pixel tile with a share of the
// channel tiles. Equal regions matter more than anything inside them: with 2 threads, blocks of
// work dealt out in turn left one thread a quarter idle.
struct Region {
  int64_t t0, t1, ot0, ot1;
};
Region region(int64_t T, int64_t OT, int threads, int i) {
  int64_t b, e;
  const bool by_pixels = (T + threads - 1) / threads * OT <= T * ((OT + threads - 1) / threads);
  split_range(by_pixels ? T : OT, threads, i, b, e);
  return by_pixels ? Region{b, e, 0, OT} : Region{0, T, b, e};
}

// Inside a region, blocks of pixel tiles times groups of channel tiles: chunk by chunk of the sum,
// each pixel tile's pointers are made once and read by every channel tile of the group (its
// inputs stay in L1), and the group's panels (together about 256 KiB) stay in L2 across the
// block's pixel tiles.
constexpr int64_t kTilesPerBlock = 32;
int64_t channel_tiles_per_group(const Geometry& g) {
  const int64_t panel = g.taps() * g.chunk() * kNR * static_cast<int64_t>(sizeof(float));
  return std::max<int64_t>(1, (256 << 10) / panel);
}

}  // namespace

bool own_direct_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return cpu_caps().avx2 && p.groups == 1 && x.dtype() == DType::f32 && w.dtype() == DType::f32 &&
         y.dtype() == DType::f32 && x.is_contiguous(MemoryFormat::channels_last) &&
         y.is_contiguous(MemoryFormat::channels_last);
}

bool own_direct_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p) {
  return own_direct_applicable(dy, w, dx, p) && flipped_data_gradient_applicable(dx, w, dy, p);
}

namespace {

// The bias padded to whole 16-channel tiles (zeros past O), as TileIo reads it; empty for none.
std::vector<float> padded_bias(const float* bias, const Geometry& g) {
  std::vector<float> b;
  if (bias != nullptr) {
    b.assign(static_cast<size_t>(g.channel_tiles() * kNR), 0.0f);
    std::copy_n(bias, g.O, b.begin());
  }
  return b;
}

// The tile of pixels p0 .. p0 + 5 and output channels o0 .. o0 + 15 in y (rows g.O apart) over
// chunk c of `chunks`: the bias where the sum starts, the residual and activation where it ends.
TileIo tile_io(const Geometry& g, float* y, const std::vector<float>& bias16, const float* res, int64_t p0, int64_t o0,
               int64_t c, int64_t chunks, bool relu, bool relu6) {
  return TileIo{y + p0 * g.O + o0,
                g.O,
                static_cast<int>(std::min<int64_t>(kNR, g.O - o0)),
                c == 0 && !bias16.empty() ? bias16.data() + o0 : nullptr,
                res != nullptr ? res + p0 * g.O + o0 : nullptr,
                c == 0,
                c == chunks - 1,
                relu || relu6,
                relu6};
}

// Threads for T pixel tiles by OT channel tiles: no more than there are tiles along the longer side.
int tile_threads(int64_t T, int64_t OT) { return static_cast<int>(std::min<int64_t>(max_threads(), std::max(T, OT))); }

// y = conv(x) + bias over geometry g with the packed weights wp; then a residual laid out as y
// (rp, or null) and a relu before each tile is stored.
void direct_conv(const Geometry& g, const float* xp, const float* wp, const float* bias, float* yp, const float* rp,
                 bool relu) {
  const int64_t OT = g.channel_tiles(), taps = g.taps(), kc = g.chunk(), chunks = g.chunks();
  const std::vector<float> bias16 = padded_bias(bias, g);
  const int64_t P = g.pixels();
  const int64_t T = (P + kMR - 1) / kMR, groups = (OT + channel_tiles_per_group(g) - 1) / channel_tiles_per_group(g);
  const int64_t G = (OT + groups - 1) / groups;  // groups of equal size
  const int threads = tile_threads(T, OT);
  parallel_for(threads, P * g.O * taps * g.C, [&](int64_t b, int64_t e) {
    std::vector<const float*> a(static_cast<size_t>(taps * kMR));
    for (int64_t i = b; i < e; ++i) {
      const Region r = region(T, OT, threads, static_cast<int>(i));
      for (int64_t tb = r.t0; tb < r.t1; tb += kTilesPerBlock)
        for (int64_t gb = r.ot0; gb < r.ot1; gb += G)
          for (int64_t c = 0; c < chunks; ++c) {
            const int64_t c0 = c * kc, n_c = std::min(kc, g.C - c0);
            for (int64_t tile = tb; tile < std::min(r.t1, tb + kTilesPerBlock); ++tile) {
              const int64_t p0 = tile * kMR;
              const int mr = static_cast<int>(std::min<int64_t>(kMR, P - p0));
              tap_pointers(g, xp, p0, mr, c0, a.data());
              for (int64_t ot = gb; ot < std::min(r.ot1, gb + G); ++ot)
                run_tile(mr, a.data(), taps, n_c, wp + ot * taps * g.C * kNR + c0 * taps * kNR,
                         tile_io(g, yp, bias16, rp, p0, ot * kNR, c, chunks, relu, false));
            }
          }
    }
  });
}

int64_t packed_floats(const Geometry& g) { return g.channel_tiles() * g.taps() * g.C * kNR; }

// The packed weights of a call: kept once per freeze for a frozen weight (inference), else packed
// into the calling thread's weight scratch slot.
const float* packed(const Tensor& w, const WeightView& v, const Geometry& g, Tensor& kept) {
  if (w.is_frozen()) {
    kept = frozen_copy(w, "duet direct: 16-channel panels", [&] {
      const Tensor t = Tensor::empty({packed_floats(g)});
      pack_weights(v, g, t.data<float>());
      return t;
    });
    return kept.data<float>();
  }
  float* buf = static_cast<float*>(scratch(static_cast<size_t>(packed_floats(g)) * sizeof(float), 0));
  pack_weights(v, g, buf);
  return buf;
}

// ---- the weight gradient ----------------------------------------------------------------------
//
// dw[o, t, c] = the sum over output pixels q of dy[q, o] * x[q seen through tap t, c]: a matrix
// product whose long sum runs over the N*OH*OW output pixels, with dy^T [O, pixels] on the left and
// x's im2col matrix [pixels, taps x C] on the right, blocked as BLIS blocks a GEMM. The sum runs in
// chunks of 256 pixels. Per chunk, dy's rows are packed in blocks of 6 output channels ([pixel][6],
// 6 KiB per block), and each column of x (one tap, 16 input channels) is packed as [term][16] (16
// KiB: it stays in L1 while every 6-channel block of the thread's region reads it). The register
// tile is 6 output by 16 input channels: per term, 2 vectors of x, 6 broadcasts of dy, 12 FMAs. A
// column's terms are the pixels whose tap falls inside the input, each with its row in the dy
// block: the padding is skipped where an im2col matrix multiplies its zeros (a 3x3 kernel onto 8x8
// maps: 1 product in 6; onto 4x4: 1 in 3). Packing also keeps the loads off strides of a power of
// two (dy rows O floats apart), which in place mapped a block's rows onto a few cache sets.

constexpr int64_t kChunkPixels = 256;  // output pixels per chunk of the sum
// 6-channel blocks of O that read a packed column of x while it is in L1: their dy blocks of a
// chunk (6 KiB each, 192 KiB) stay in L2.
constexpr int64_t kRowsPerGroup = 32;

// Sums n terms onto a 6x16 tile at acc (rows lda apart; set instead when first): term k is x's 16
// channels at xp + 16k times the 6 dy values at dyb + off[k].
__attribute__((noinline)) DUET_AVX2_FMA void wgrad_tile(const float* xp, const int32_t* off, const float* dyb, int64_t n,
                                                        float* acc, int64_t lda, bool first) {
  __m256 s0[kMR], s1[kMR];
#pragma GCC unroll 6
  for (int m = 0; m < kMR; ++m) {
    s0[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + m * lda);
    s1[m] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc + m * lda + 8);
  }
  for (int64_t k = 0; k < n; ++k, xp += kNR) {
    const __m256 b0 = _mm256_loadu_ps(xp), b1 = _mm256_loadu_ps(xp + 8);
    const float* d = dyb + off[k];
#pragma GCC unroll 6
    for (int m = 0; m < kMR; ++m) {
      const __m256 v = _mm256_broadcast_ss(d + m);
      s0[m] = _mm256_fmadd_ps(v, b0, s0[m]);
      s1[m] = _mm256_fmadd_ps(v, b1, s1[m]);
    }
  }
#pragma GCC unroll 6
  for (int m = 0; m < kMR; ++m) {
    _mm256_storeu_ps(acc + m * lda, s0[m]);
    _mm256_storeu_ps(acc + m * lda + 8, s1[m]);
  }
}

// One chunk's terms: for each tap t, count[t] of them from terms[t * kChunkPixels], each with its
// input pixel's channels (src) and its offset into a dy block (off: 6 floats per pixel of the chunk).
struct ChunkTerms {
  std::vector<const float*> src;
  std::vector<int32_t> off;
  std::vector<int64_t> count;
  explicit ChunkTerms(int64_t taps)
      : src(static_cast<size_t>(taps * kChunkPixels)), off(src.size()), count(static_cast<size_t>(taps)) {}

  void build(const Geometry& g, const float* x, int64_t q0, int64_t q1) {
    std::fill(count.begin(), count.end(), 0);
    int64_t n = q0 / (g.OH * g.OW), oh = q0 / g.OW % g.OH, ow = q0 % g.OW;  // then stepped, not divided
    for (int64_t q = q0; q < q1; ++q) {
      for (int64_t kh = 0; kh < g.KH; ++kh) {
        const int64_t ih = conv_in_index(oh, kh, g.sh, g.ph, g.dh);
        if (ih < 0 || ih >= g.H) continue;
        for (int64_t kw = 0; kw < g.KW; ++kw) {
          const int64_t iw = conv_in_index(ow, kw, g.sw, g.pw, g.dw);
          if (iw < 0 || iw >= g.W) continue;
          const int64_t t = kh * g.KW + kw, i = t * kChunkPixels + count[t]++;
          src[i] = x + ((n * g.H + ih) * g.W + iw) * g.C;
          off[i] = static_cast<int32_t>((q - q0) * kMR);
        }
      }
      if (++ow == g.OW) {
        ow = 0;
        if (++oh == g.OH) {
          oh = 0;
          ++n;
        }
      }
    }
  }
};

// dy's rows q0..q1 of output channels [6 * row0, 6 * row1) as blocks of 6 channels, [pixel][6]
// each, kChunkPixels pixels apart; zeros past O.
void pack_dy(const Geometry& g, const float* dy, int64_t q0, int64_t q1, int64_t row0, int64_t row1, float* dst) {
  const int64_t whole = std::min(row1, g.O / kMR);  // blocks of 6 channels that all exist
  for (int64_t q = q0; q < q1; ++q) {
    const float* d = dy + q * g.O;
    float* out = dst + (q - q0) * kMR;
    int64_t row = row0;
    for (; row < whole; ++row) std::memcpy(out + (row - row0) * kChunkPixels * kMR, d + row * kMR, kMR * sizeof(float));
    for (; row < row1; ++row)
      for (int64_t m = 0; m < kMR; ++m)
        out[(row - row0) * kChunkPixels * kMR + m] = row * kMR + m < g.O ? d[row * kMR + m] : 0.0f;
  }
}

// A column of x: the 16 input channels from c0 (nvalid exist; zeros after) of each of n terms'
// pixels, [term][16].
DUET_AVX2_FMA void pack_column(const float* const* src, int64_t n, int64_t c0, int nvalid, float* dst) {
  if (nvalid == kNR) {
    for (int64_t k = 0; k < n; ++k) {
      _mm256_storeu_ps(dst + k * kNR, _mm256_loadu_ps(src[k] + c0));
      _mm256_storeu_ps(dst + k * kNR + 8, _mm256_loadu_ps(src[k] + c0 + 8));
    }
    return;
  }
  for (int64_t k = 0; k < n; ++k) {
    float* out = dst + k * kNR;
    std::copy_n(src[k] + c0, nvalid, out);
    std::fill(out + nvalid, out + kNR, 0.0f);
  }
}

// dw over geometry g (x the input, dy the output gradient) into acc, laid out [O, KH, KW, C]. Each
// thread owns one region of dw (region() above): a share of the 6-channel blocks of O with every
// column (tap, 16 input channels), or where that balances worse the reverse, so no sum is shared
// and the bits do not depend on the thread count. Shares of O pack a share of dy each, shares of
// the columns a share of x; on AMD Zen 3 (2 threads) neither was faster beyond the host's noise
// (256->256 3x3 at 8x8, batch 64: 24.6-26.7 ms by shares of O against 30.3-33.0 in one run, the
// two within 10% either way in three others).
void direct_weight_gradient(const Geometry& g, const float* xp, const float* dyp, float* acc) {
  const int64_t taps = g.taps(), P = g.pixels(), lda = taps * g.C;
  const int64_t rows = (g.O + kMR - 1) / kMR, ctiles = (g.C + kNR - 1) / kNR, cols = taps * ctiles;
  const int threads = static_cast<int>(std::min<int64_t>(max_threads(), std::max(rows, cols)));
  parallel_for(threads, P * g.O * lda, [&](int64_t b, int64_t e) {
    ChunkTerms terms(taps);
    std::vector<float> panel(static_cast<size_t>(kChunkPixels * kNR));
    for (int64_t i = b; i < e; ++i) {
      const Region r = region(rows, cols, threads, static_cast<int>(i));
      const int64_t row0 = r.t0, row1 = r.t1, col0 = r.ot0, col1 = r.ot1;
      float* dyb = static_cast<float*>(scratch(static_cast<size_t>((row1 - row0) * kChunkPixels * kMR) * sizeof(float), 0));
      for (int64_t q0 = 0; q0 < P; q0 += kChunkPixels) {
        const int64_t q1 = std::min(P, q0 + kChunkPixels);
        terms.build(g, xp, q0, q1);
        pack_dy(g, dyp, q0, q1, row0, row1, dyb);
        for (int64_t rg = row0; rg < row1; rg += kRowsPerGroup)
          for (int64_t col = col0; col < col1; ++col) {
            // Tap by tap within each group of 16 input channels: the nine taps of a group read the
            // same lines of x, still in L2 (a cold-cache 256->256 at 8x8 took 44 ms taps-first, 33 so).
            const int64_t t = col % taps, c0 = col / taps * kNR, n = terms.count[static_cast<size_t>(t)];
            const int nvalid = static_cast<int>(std::min<int64_t>(kNR, g.C - c0));
            pack_column(terms.src.data() + t * kChunkPixels, n, c0, nvalid, panel.data());
            for (int64_t row = rg; row < std::min(row1, rg + kRowsPerGroup); ++row) {
              const int64_t o0 = row * kMR;
              const int mr = static_cast<int>(std::min<int64_t>(kMR, g.O - o0));
              const float* block = dyb + (row - row0) * kChunkPixels * kMR;
              float* tile = acc + o0 * lda + t * g.C + c0;
              if (mr == kMR && nvalid == kNR) {
                wgrad_tile(panel.data(), terms.off.data() + t * kChunkPixels, block, n, tile, lda, q0 == 0);
                continue;
              }
              // A partial tile sums in a whole one and keeps the part that exists.
              alignas(32) float part[kMR * kNR] = {};
              if (q0 > 0)
                for (int64_t m = 0; m < mr; ++m) std::copy_n(tile + m * lda, nvalid, part + m * kNR);
              wgrad_tile(panel.data(), terms.off.data() + t * kChunkPixels, block, n, part, kNR, q0 == 0);
              for (int64_t m = 0; m < mr; ++m) std::copy_n(part + m * kNR, nvalid, tile + m * lda);
            }
          }
      }
    }
  });
}

}  // namespace

void own_direct_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                        const Conv2dParams& p) {
  const Geometry g = geometry(x, y, w.size(2), w.size(3), p);
  const StoreEpilogue in_store = store_epilogue(y, residual, p.act);
  if (g.pixels() > 0 && g.O > 0) {
    Tensor kept, b;
    const float* wp = packed(w, forward_weights(w), g, kept);
    if (bias.defined()) b = bias.dtype() == DType::f32 ? bias.contiguous() : bias.to(DType::f32);
    direct_conv(g, x.data<float>(), wp, b.defined() ? b.data<float>() : nullptr, y.data<float>(),
                in_store.residual, in_store.relu);
  }
  finish_store_epilogue(in_store, y, residual, p.act);
}

namespace {
std::atomic<KernelPolicy> g_matmul_policy{policy_from_env("DUET_DIRECT_MATMUL")};

// c = a @ b + bias over a 1x1 geometry g (M = g.OH pixel rows of K = g.C channels, N = g.O
// outputs), then a residual (rows N apart) and relu/relu6. The convolution's loops above keep a
// pixel tile's inputs in L1 while a group of panels passes from L2; here the sum is short (one
// tap) and the panel is the larger operand, so the loops turn round: each panel chunk stays in L1
// while the pixel tiles of a block of rows (about 128 KiB of a, from L2) pass over it. On two Zen 3
// threads the convolution's order took 1.75x oneDNN's time on 1024 x 64 -> 64 and 1.32x on
// 520 x 192 -> 768, this one 1.10x and 1.16x (journal, 2026-11-30, evening).
void direct_matmul(const Geometry& g, const float* ap, const float* wp, const float* bias, float* cp, const float* rp,
                   bool relu, bool relu6) {
  const int64_t M = g.OH, K = g.C, N = g.O, OT = g.channel_tiles(), kc = g.chunk(), chunks = g.chunks();
  const std::vector<float> bias16 = padded_bias(bias, g);
  const int64_t T = (M + kMR - 1) / kMR;
  const int64_t block = std::max<int64_t>(1, (128 << 10) / (kMR * K * static_cast<int64_t>(sizeof(float))));
  const int threads = tile_threads(T, OT);
  parallel_for(threads, M * N * K, [&](int64_t b, int64_t e) {
    const float* a[kMR];
    for (int64_t i = b; i < e; ++i) {
      const Region r = region(T, OT, threads, static_cast<int>(i));
      for (int64_t tb = r.t0; tb < r.t1; tb += block)
        for (int64_t ot = r.ot0; ot < r.ot1; ++ot)
          for (int64_t c = 0; c < chunks; ++c) {
            const int64_t c0 = c * kc, n_c = std::min(kc, K - c0);
            for (int64_t tile = tb; tile < std::min(r.t1, tb + block); ++tile) {
              const int64_t p0 = tile * kMR;
              const int mr = static_cast<int>(std::min<int64_t>(kMR, M - p0));
              for (int m = 0; m < mr; ++m) a[m] = ap + (p0 + m) * K + c0;
              run_tile(mr, a, 1, n_c, wp + ot * K * kNR + c0 * kNR,
                       tile_io(g, cp, bias16, rp, p0, ot * kNR, c, chunks, relu, relu6));
            }
          }
    }
  });
}
}  // namespace

void set_direct_matmul_policy(KernelPolicy p) { g_matmul_policy.store(p); }
KernelPolicy direct_matmul_policy() { return g_matmul_policy.load(); }

bool own_direct_matmul_wanted(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                              const GemmEpilogue& epi) {
  const KernelPolicy policy = direct_matmul_policy();
  if (policy == KernelPolicy::never || !cpu_caps().avx2) return false;
  if (policy == KernelPolicy::automatic &&
      (small_gemm_available() || a.rows * a.cols * c.cols > kDirectMatmulMaxMacs))  // AVX-512: oneDNN's brgemm
    return false;
  const auto f32 = [](const Tensor& t) { return t.dtype() == DType::f32; };
  if (!f32(a.t) || !f32(b.t) || !f32(c.t) || (bias.defined() && !f32(bias))) return false;
  if (epi.accumulate || (epi.act && *epi.act != Activation::relu && *epi.act != Activation::relu6)) return false;
  if (epi.residual && (!f32(epi.residual->t) || epi.residual->col != 1 || epi.residual->row != c.cols)) return false;
  // Products of at most four rows are skinny_gemm.h's (it reads the weights as they lie).
  return a.rows > kSkinnyMaxRows && a.cols >= 1 && c.cols >= 1 && a.col == 1 && a.row == a.cols && b.row == 1 &&
         c.col == 1 && c.row == c.cols;
}

void own_direct_matmul(const MatrixOperand& a, const MatrixOperand& b, const MatrixOperand& c, const Tensor& bias,
                       const GemmEpilogue& epi) {
  DUET_CHECK(own_direct_matmul_wanted(a, b, c, bias, epi),
             "own_direct_matmul: expected f32 rows laid out as a map's pixels and AVX2 (own_direct_matmul_wanted "
             "says so first)");
  // A map of a.rows x 1 pixels with K channels, a 1x1 kernel into N channels.
  const int64_t M = a.rows, K = a.cols, N = c.cols;
  const Geometry g{1, K, M, 1, N, M, 1, 1, 1, 1, 1, 0, 0, 1, 1};
  const WeightView v{static_cast<const float*>(b.t.raw_data()), b.col, 1, 0, 0};  // weight (o, c) at o * ldw + c
  Tensor kept, b32;
  const float* wp = packed(b.t, v, g, kept);
  if (bias.defined()) b32 = bias.contiguous();
  const bool relu6 = epi.act == Activation::relu6;
  direct_matmul(g, static_cast<const float*>(a.t.raw_data()), wp, b32.defined() ? b32.data<float>() : nullptr,
                static_cast<float*>(c.t.raw_data()),
                epi.residual ? static_cast<const float*>(epi.residual->t.raw_data()) : nullptr,
                epi.act == Activation::relu, relu6);
}

void own_direct_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  const Geometry g = geometry(dy, dx, w.size(2), w.size(3), flipped_forward_params(p, w));
  if (g.pixels() == 0 || g.O == 0) return;
  Tensor unused;  // a weight being trained is never frozen
  const float* wp = packed(w, flipped_weights(w), g, unused);
  direct_conv(g, dy.data<float>(), wp, nullptr, dx.data<float>(), nullptr, false);
}

void own_direct_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p) {
  const Geometry g = geometry(x, dy, dw.size(2), dw.size(3), p);
  weight_gradient_in_ohwi(dw, [&](const Tensor& out) {
    if (g.pixels() == 0)
      std::fill_n(out.data<float>(), out.numel(), 0.0f);
    else
      direct_weight_gradient(g, x.data<float>(), dy.data<float>(), out.data<float>());
  });
}

}  // namespace duet::cpu
