// duet's own Winograd convolution F(4x4, 3x3) (winograd_conv.h): AVX2 transforms over 8 channels
// at a time around 36 matrix products on oneDNN's batched matmul.
//
// The transformed tensors, each 36 matrices (one per position xi of the 6x6 transformed tile):
//   V [36][tiles][C]  the input windows   (V = B^T d B)
//   U [36][C][O]      the kernels         (U = G g G^T)
//   M [36][tiles][O]  their products      (M[xi] = V[xi] U[xi]), then y = A^T M A per tile
#include "backends/cpu/winograd_conv.h"
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <type_traits>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_kernels.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/planner.h"
#include "engine/frozen_copies.h"

namespace duet::cpu {

namespace {

constexpr int kTile = 4;                   // output pixels per side of a tile
constexpr int kWindow = kTile + 2;         // input pixels per side of the window a tile sees
constexpr int kXi = kWindow * kWindow;     // positions of the transformed domain: 36 products
constexpr int kLanes = 8;                  // channels per AVX2 vector

// The 36 matrices of a transformed tensor (V, U, M, dM or dU), each `stride` floats after the one
// before. A transform reads or writes one row of every matrix at a time; with the matrices a
// multiple of 4 KiB apart those 36 rows fall onto the same few cache sets, so each is padded by a
// few lines (the kernel transform of 512->512, timed inside resnet18_cifar's step on AMD Zen 3,
// took 9.9-11.4 ms unpadded and 8.8-9.4 padded, one run each).
constexpr int64_t kPlanePad = 48;
struct Planes {
  float* base;
  int64_t rows, cols, stride;
  float* row(int xi, int64_t r) const { return base + xi * stride + r * cols; }
};
int64_t planes_floats(int64_t rows, int64_t cols) { return kXi * (rows * cols + kPlanePad); }
Planes planes_in(const Tensor& t, int64_t rows, int64_t cols) {
  return {t.data<float>(), rows, cols, rows * cols + kPlanePad};
}
Tensor planes_tensor(int64_t rows, int64_t cols) { return Tensor::empty({planes_floats(rows, cols)}); }
MatrixOperand matrices(const Tensor& t, const Planes& p) { return {t, p.rows, p.cols, p.cols, 1, p.stride}; }
MatrixOperand transposed_matrices(const Tensor& t, const Planes& p) { return {t, p.cols, p.rows, 1, p.cols, p.stride}; }

// ---- the transforms ----------------------------------------------------------------------------------
// Toom-Cook's matrices for the points 0, 1, -1, 2, -1/2 and infinity. In f32 their rounding error is
// about half that of Lavin & Gray's points (0, 1, -1, 2, -2) and 7x a direct sum's: the largest
// error of a 4x4 tile against the exact sum, over 256 channels (inputs in [-1, 1], weights in
// [-0.1, 0.1], median of 60 draws), was 6.6e-6 with these points, 12.5e-6 with Lavin & Gray's and
// 1.0e-6 for a direct sum; over 64 channels 1.9e-6, 2.9e-6 and 0.28e-6 (bench/winograd_error.py,
// which also tries other sets). Row j of B^T holds the coefficients of the product of (x - p) over
// the points p other than p_j (over all of them for the last row); G's row j is (1, p_j, p_j^2)
// over the product of (p_j - p) over the others; A^T's column j is (1, p_j, p_j^2, p_j^3).
template <int R, int K>
struct Matrix {
  static constexpr int rows = R, cols = K;
  float at[R][K];
};
template <int R, int K>
constexpr Matrix<K, R> transposed(const Matrix<R, K>& m) {
  Matrix<K, R> t{};
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < K; ++j) t.at[j][i] = m.at[i][j];
  return t;
}
constexpr Matrix<6, 6> kBT = {{{1, 1.5f, -2, -1.5f, 1, 0},
                               {0, -1, -2.5f, -0.5f, 1, 0},
                               {0, 1, 0.5f, -2.5f, 1, 0},
                               {0, -0.5f, -1, 0.5f, 1, 0},
                               {0, 2, -1, -2, 1, 0},
                               {0, 1, 1.5f, -2, -1.5f, 1}}};
constexpr Matrix<6, 3> kG = {{{1, 0, 0},
                              {-1.0f / 3, -1.0f / 3, -1.0f / 3},
                              {1.0f / 3, -1.0f / 3, 1.0f / 3},
                              {1.0f / 15, 2.0f / 15, 4.0f / 15},
                              {-16.0f / 15, 8.0f / 15, -4.0f / 15},
                              {0, 0, 1}}};
constexpr Matrix<4, 6> kAT = {{{1, 1, 1, 1, 1, 0},
                               {0, 1, -1, 2, -0.5f, 0},
                               {0, 1, 1, 4, 0.25f, 0},
                               {0, 1, -1, 8, -0.125f, 1}}};
// The weight gradient's steps back through the output and kernel transforms.
constexpr Matrix<6, 4> kA = transposed(kAT);
constexpr Matrix<3, 6> kGT = transposed(kG);

// r = Mx d for a line of vectors d (elements ds apart) into r (rs apart); a 2-D transform is this
// down every column, then along every row. Unrolled, the products by Mx's zeros drop out and those
// by its ones become additions (the entries are constants).
template <const auto& Mx>
DUET_AVX2_FMA inline void apply(const __m256* d, int ds, __m256* r, int rs) {
  constexpr int R = std::remove_cvref_t<decltype(Mx)>::rows, K = std::remove_cvref_t<decltype(Mx)>::cols;
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i) {
    __m256 sum = _mm256_setzero_ps();
    bool started = false;
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) {
      const float m = Mx.at[i][j];
      if (m == 0.0f) continue;
      sum = started ? sum + m * d[j * ds] : m * d[j * ds];
      started = true;
    }
    r[i * rs] = sum;
  }
}

// The first n of 8 lanes (n < 8: masked loads read nothing past them).
struct Lanes {
  int n;
  __m256i mask;
  DUET_AVX2_FMA explicit Lanes(int64_t count) : n(static_cast<int>(std::min<int64_t>(kLanes, count))) {
    mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  DUET_AVX2_FMA __m256 load(const float* p) const { return n == kLanes ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, mask); }
  DUET_AVX2_FMA void store(float* p, __m256 v) const {
    if (n == kLanes) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, mask, v);
  }
};

// ---- the tiles --------------------------------------------------------------------------------------

// A convolution's maps cut into tiles: x [N, H, W, C] (channels-last), y [N, OH, OW, O], tiles of
// 4x4 outputs, TH x TW per image, each seeing x from (4 * th - ph, 4 * tw - pw).
struct Tiles {
  int64_t N, H, W, C, OH, OW, O, ph, pw, TH, TW;
  int64_t count() const { return N * TH * TW; }
};
Tiles tiles_of(const Tensor& x, const Tensor& y, int64_t ph, int64_t pw) {
  const int64_t OH = y.size(2), OW = y.size(3);
  return {x.size(0), x.size(2), x.size(3), x.size(1), OH, OW, y.size(1), ph, pw,
          (OH + kTile - 1) / kTile, (OW + kTile - 1) / kTile};
}

// V[xi][row][.] = (B^T d B)[xi] for tile t's window d of x (zeros outside the map), 8 channels at a time.
DUET_AVX2_FMA void transform_input_tile(const Tiles& g, const float* x, int64_t t, const Planes& V, int64_t row) {
  const int64_t n = t / (g.TH * g.TW), h0 = t / g.TW % g.TH * kTile - g.ph, w0 = t % g.TW * kTile - g.pw;
  const float* image = x + n * g.H * g.W * g.C;
  for (int64_t c = 0; c < g.C; c += kLanes) {
    const Lanes lanes(g.C - c);
    __m256 d[kXi], e[kXi];
    for (int i = 0; i < kWindow; ++i)
      for (int j = 0; j < kWindow; ++j) {
        const int64_t h = h0 + i, w = w0 + j;
        const bool inside = h >= 0 && h < g.H && w >= 0 && w < g.W;
        d[i * kWindow + j] = inside ? lanes.load(image + (h * g.W + w) * g.C + c) : _mm256_setzero_ps();
      }
    for (int j = 0; j < kWindow; ++j) apply<kBT>(d + j, kWindow, e + j, kWindow);
    for (int i = 0; i < kWindow; ++i) apply<kBT>(e + i * kWindow, 1, d + i * kWindow, 1);
    for (int xi = 0; xi < kXi; ++xi) lanes.store(V.row(xi, row) + c, d[xi]);
  }
}

// Where kernel (out, in, kh, kw) lies: base + out * so + in * si + kh * skh + kw * skw. A data
// gradient reads w turned 180 degrees with its channels swapped (negative tap strides).
struct KernelView {
  const float* base;
  int64_t so, si, skh, skw;
};
KernelView forward_kernels(const Tensor& w) { return {w.data<float>(), w.stride(0), w.stride(1), w.stride(2), w.stride(3)}; }
KernelView flipped_kernels(const Tensor& w) {
  return {w.data<float>() + 2 * w.stride(2) + 2 * w.stride(3), w.stride(1), w.stride(0), -w.stride(2), -w.stride(3)};
}

// The kernels' loops run over blocks of 16 output channels (two vectors: one 64-byte line of a
// transformed row), each block over every input channel. Each thread then reads its kernels as
// 16 sequential streams and writes whole lines. The other order, input channels outside, read
// kernels C * 9 floats apart in NCHW (512 such lines fall onto 2 sets of L1 and 32 of L2): the
// kernel transform of 512->512 took 13.9-15.2 ms so, 8.8-9.4 this way (timed as above).
constexpr int64_t kBlock = 2 * kLanes;

// U[xi][in][out] = (G g G^T)[xi] for the kernel g of each channel pair, output channel blocks
// [block_begin, block_end).
DUET_AVX2_FMA void transform_kernels(const KernelView& v, int64_t I, int64_t O, int64_t block_begin, int64_t block_end,
                                     const Planes& U) {
  for (int64_t ob = block_begin; ob < block_end; ++ob)
    for (int64_t i = 0; i < I; ++i)
      for (int64_t o = ob * kBlock; o < std::min(O, (ob + 1) * kBlock); o += kLanes) {
        const Lanes lanes(O - o);
        alignas(32) float gathered[9][kLanes] = {};
        for (int l = 0; l < lanes.n; ++l)
          for (int k = 0; k < 9; ++k) gathered[k][l] = v.base[(o + l) * v.so + i * v.si + k / 3 * v.skh + k % 3 * v.skw];
        __m256 g[9], e[3 * kWindow], u[kXi];
        for (int k = 0; k < 9; ++k) g[k] = _mm256_load_ps(gathered[k]);
        for (int j = 0; j < 3; ++j) apply<kG>(g + j, 3, e + j, 3);  // e: 6 x 3
        for (int r = 0; r < kWindow; ++r) apply<kG>(e + r * 3, 1, u + r * kWindow, 1);
        for (int xi = 0; xi < kXi; ++xi) lanes.store(U.row(xi, i) + o, u[xi]);
      }
}

// y's tile t = A^T M A, then + bias, + a residual laid out as y, relu (what store_epilogue leaves
// to the kernel, conv_kernels.h); the pixels inside the map.
struct Epilogue : StoreEpilogue {
  const float* bias = nullptr;  // O floats, or null
};
// (M's row `row` holds tile t.)
DUET_AVX2_FMA void transform_output_tile(const Tiles& g, const Planes& M, int64_t row, int64_t t, const Epilogue& epi,
                                         float* y) {
  const int64_t n = t / (g.TH * g.TW), h0 = t / g.TW % g.TH * kTile, w0 = t % g.TW * kTile;
  const int64_t rows = std::min<int64_t>(kTile, g.OH - h0), cols = std::min<int64_t>(kTile, g.OW - w0);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t o = 0; o < g.O; o += kLanes) {
    const Lanes lanes(g.O - o);
    __m256 m[kXi], e[kTile * kWindow], out[kTile * kTile];
    for (int xi = 0; xi < kXi; ++xi) m[xi] = lanes.load(M.row(xi, row) + o);
    for (int j = 0; j < kWindow; ++j) apply<kAT>(m + j, kWindow, e + j, kWindow);  // e: 4 x 6
    for (int i = 0; i < kTile; ++i) apply<kAT>(e + i * kWindow, 1, out + i * kTile, 1);
    const __m256 b = epi.bias != nullptr ? lanes.load(epi.bias + o) : zero;
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j) {
        const int64_t at = ((n * g.OH + h0 + i) * g.OW + w0 + j) * g.O + o;
        __m256 v = out[i * kTile + j] + b;
        if (epi.residual != nullptr) v = v + lanes.load(epi.residual + at);
        if (epi.relu) v = _mm256_max_ps(zero, v);  // max(0, v) is v when v is NaN, as the reference's relu
        lanes.store(y + at, v);
      }
  }
}

// dM[xi][row][.] = (A e A^T)[xi] for tile t's 4x4 block e of dy (zeros outside the map).
DUET_AVX2_FMA void transform_grad_output_tile(const Tiles& g, const float* dy, int64_t t, const Planes& dM,
                                              int64_t row) {
  const int64_t n = t / (g.TH * g.TW), h0 = t / g.TW % g.TH * kTile, w0 = t % g.TW * kTile;
  for (int64_t o = 0; o < g.O; o += kLanes) {
    const Lanes lanes(g.O - o);
    __m256 e[kTile * kTile], f[kWindow * kTile], m[kXi];
    for (int i = 0; i < kTile; ++i)
      for (int j = 0; j < kTile; ++j) {
        const bool inside = h0 + i < g.OH && w0 + j < g.OW;
        e[i * kTile + j] = inside ? lanes.load(dy + ((n * g.OH + h0 + i) * g.OW + w0 + j) * g.O + o) : _mm256_setzero_ps();
      }
    for (int j = 0; j < kTile; ++j) apply<kA>(e + j, kTile, f + j, kTile);  // f: 6 x 4
    for (int i = 0; i < kWindow; ++i) apply<kA>(f + i * kTile, 1, m + i * kWindow, 1);
    for (int xi = 0; xi < kXi; ++xi) lanes.store(dM.row(xi, row) + o, m[xi]);
  }
}

// dw[o, c] = G^T dU[.][c][o] G for output channel blocks [block_begin, block_end), stored through
// dw's strides.
DUET_AVX2_FMA void kernel_gradients(const Planes& dU, int64_t C, int64_t O, int64_t block_begin, int64_t block_end,
                                    const Tensor& dw) {
  float* base = dw.data<float>();
  const int64_t s0 = dw.stride(0), s1 = dw.stride(1), s2 = dw.stride(2), s3 = dw.stride(3);
  for (int64_t ob = block_begin; ob < block_end; ++ob)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t o = ob * kBlock; o < std::min(O, (ob + 1) * kBlock); o += kLanes) {
        const Lanes lanes(O - o);
        __m256 u[kXi], e[3 * kWindow], k[9];
        for (int xi = 0; xi < kXi; ++xi) u[xi] = lanes.load(dU.row(xi, c) + o);
        for (int j = 0; j < kWindow; ++j) apply<kGT>(u + j, kWindow, e + j, kWindow);  // e: 3 x 6
        for (int r = 0; r < 3; ++r) apply<kGT>(e + r * kWindow, 1, k + r * 3, 1);
        alignas(32) float out[9][kLanes];
        for (int t = 0; t < 9; ++t) _mm256_store_ps(out[t], k[t]);
        for (int l = 0; l < lanes.n; ++l)
          for (int t = 0; t < 9; ++t) base[(o + l) * s0 + c * s1 + t / 3 * s2 + t % 3 * s3] = out[t][l];
      }
}

// ---- the passes -----------------------------------------------------------------------------------

// Tiles [t0, t0 + V.rows) into V's rows from 0.
void transform_input(const Tiles& g, const float* x, int64_t t0, const Planes& V) {
  parallel_for(V.rows, V.rows * kXi * g.C, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) transform_input_tile(g, x, t0 + r, V, r);
  });
}

// U for kernels v: into `out` (planes_floats(I, O) floats), I input channels by O output channels.
void transform_kernels(const KernelView& v, int64_t I, int64_t O, const Tensor& out) {
  const Planes U = planes_in(out, I, O);
  parallel_for((O + kBlock - 1) / kBlock, I * O * kXi, [&](int64_t b, int64_t e) { transform_kernels(v, I, O, b, e, U); });
}

// The forward and the weight gradient run block by block of tiles: each block's V and M (or dM;
// 36 rows of C and O floats per tile) take about kBlockBytes, so that the products and the
// transforms after them read them from cache and the workspace stays bounded (DenseNet-121's
// 128->32 layers at 224 px would need 290 MB).
// Unblocked, the transforms of 64->64 at 32x32 (V and M 37.7 MB each) ran at the memory's 6-8 GB/s
// and took 15 of the forward's 25 ms (AMD Zen 3, a temporary per-phase trace); blocked, whole
// training steps took 0.94x (resnet18_cifar) and 0.97x (resnet50_cifar) of the unblocked time,
// with pairwise rounds from 0.83x to 1.02x (bench/results/compare_zen3_winograd_blocked_train.json).
constexpr int64_t kBlockBytes = 4 << 20;
constexpr int64_t kMinBlockTiles = 64;  // the products' rows: fewer make oneDNN's calls the cost
int64_t block_tiles(const Tiles& g) { return std::max<int64_t>(kMinBlockTiles, kBlockBytes / (kXi * (g.C + g.O) * 4)); }
// The weight gradient's blocks are larger: each block's 36 products add C x O floats each to dU,
// which is read and written again per block (9.4 MB for 256 -> 256), and their inner dimension is
// the block's tiles. Blocks of the forward's size made resnet18_cifar's training step 1.06x slower
// (journal, 2026-11-30); these bound the workspace all the same.
constexpr int64_t kGradBlockBytes = 32 << 20;
constexpr int64_t kMinGradBlockTiles = 1024;
std::atomic<int64_t> g_grad_block_tiles{0};  // set_own_winograd_gradient_block_tiles
int64_t grad_block_tiles(const Tiles& g) {
  if (const int64_t tiles = g_grad_block_tiles.load(); tiles > 0) return tiles;
  return std::max<int64_t>(kMinGradBlockTiles, kGradBlockBytes / (kXi * (g.C + g.O) * 4));
}

// The tiles of g in blocks of at most `per_block`: for each block, `body(t0, Vt, V, Wt, W)` with V
// holding the block's transformed input (its rows from 0 are tiles t0, t0 + 1, ...) and W planes of
// g.O floats per tile for the pass to fill (M or dM), both in workspace for one block.
template <class Body>
void for_each_tile_block(const Tiles& g, const float* x, int64_t per_block, Body&& body) {
  const int64_t T = g.count(), Tb = std::min(T, per_block);
  const Tensor Vt = planes_tensor(Tb, g.C), Wt = planes_tensor(Tb, g.O);
  for (int64_t t0 = 0; t0 < T; t0 += Tb) {
    Planes V = planes_in(Vt, Tb, g.C), W = planes_in(Wt, Tb, g.O);
    V.rows = W.rows = std::min(Tb, T - t0);  // the last block's; the planes stay where they are
    transform_input(g, x, t0, V);
    body(t0, Vt, V, Wt, W);
  }
}

// y = epilogue(conv(x)) for x [N, I, H, W] -> y [N, O, OH, OW], both channels-last, by the
// transformed kernels U (planes of [I, O]).
void winograd_forward(const Tensor& x, const Tensor& U, const Tensor& y, int64_t ph, int64_t pw, const Epilogue& epi) {
  const Tiles g = tiles_of(x, y, ph, pw);
  const MatrixOperand u = matrices(U, planes_in(U, g.C, g.O));
  for_each_tile_block(g, x.data<float>(), block_tiles(g),
                      [&](int64_t t0, const Tensor& Vt, const Planes& V, const Tensor& Mt, const Planes& M) {
                        gemm_batched("conv2d", kXi, matrices(Vt, V), u, matrices(Mt, M));
                        parallel_for(M.rows, M.rows * kXi * g.O, [&](int64_t b, int64_t e) {
                          for (int64_t r = b; r < e; ++r) transform_output_tile(g, M, r, t0 + r, epi, y.data<float>());
                        });
                      });
}

// The forward's transformed kernels: kept once per freeze for a frozen weight (inference), else
// transformed at every call. The kept copy is 4x the weight (36 floats per kernel of 9): about
// 150 MB for resnet18_cifar's 3x3 stride-1 layers.
Tensor forward_kernels_transformed(const Tensor& w) {
  const int64_t O = w.size(0), C = w.size(1);
  const auto make = [&] {
    const Tensor U = planes_tensor(C, O);
    transform_kernels(forward_kernels(w), C, O, U);
    return U;
  };
  return w.is_frozen() ? frozen_copy(w, "duet winograd: transformed kernels", make) : make();
}

}  // namespace

void set_own_winograd_gradient_block_tiles(int64_t tiles) { g_grad_block_tiles.store(tiles); }

bool own_winograd_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return cpu_caps().avx2 && p.groups == 1 && x.dtype() == DType::f32 && w.dtype() == DType::f32 &&
         y.dtype() == DType::f32 && w.size(2) == 3 && w.size(3) == 3 && p.stride_h == 1 && p.stride_w == 1 &&
         p.dilation_h == 1 && p.dilation_w == 1 && p.pad_h <= 2 && p.pad_w <= 2 &&
         x.is_contiguous(MemoryFormat::channels_last) && y.is_contiguous(MemoryFormat::channels_last);
}

bool own_winograd_data_gradient_applicable(const Tensor& dx, const Tensor& w, const Tensor& dy, const Conv2dParams& p) {
  return own_winograd_applicable(dy, w, dx, p);
}

void own_winograd_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                          const Conv2dParams& p) {
  Epilogue epi;
  static_cast<StoreEpilogue&>(epi) = store_epilogue(y, residual, p.act);
  Tensor b;
  if (bias.defined()) {
    b = bias.dtype() == DType::f32 ? bias.contiguous() : bias.to(DType::f32);
    epi.bias = b.data<float>();
  }
  if (x.size(0) > 0 && y.size(1) > 0) winograd_forward(x, forward_kernels_transformed(w), y, p.pad_h, p.pad_w, epi);
  finish_store_epilogue(epi, y, residual, p.act);
}

void own_winograd_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  if (dx.numel() == 0) return;
  const Conv2dParams q = flipped_forward_params(p, w);
  const int64_t O = w.size(0), C = w.size(1);
  const Tensor U = planes_tensor(O, C);  // the flipped kernels: O inputs, C outputs
  transform_kernels(flipped_kernels(w), O, C, U);
  winograd_forward(dy, U, dx, q.pad_h, q.pad_w, {});
}

void own_winograd_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p) {
  const Tiles g = tiles_of(x, dy, p.pad_h, p.pad_w);
  const int64_t T = g.count();
  if (T == 0) {  // an empty sum (dw is dense in any layout)
    std::fill_n(dw.data<float>(), dw.numel(), 0.0f);
    return;
  }
  // In blocks of tiles (grad_block_tiles): dU[xi] = V[xi]^T dM[xi] is a sum over the tiles, so
  // each block's products add to the blocks' before (oneDNN's sum post-op).
  const Tensor dUt = planes_tensor(g.C, g.O);
  const Planes dU = planes_in(dUt, g.C, g.O);
  for_each_tile_block(g, x.data<float>(), grad_block_tiles(g),
                      [&](int64_t t0, const Tensor& Vt, const Planes& V, const Tensor& dMt, const Planes& dM) {
                        parallel_for(dM.rows, dM.rows * kXi * g.O, [&](int64_t b, int64_t e) {
                          for (int64_t r = b; r < e; ++r) transform_grad_output_tile(g, dy.data<float>(), t0 + r, dM, r);
                        });
                        GemmEpilogue sum;
                        sum.accumulate = t0 > 0;
                        gemm_batched("conv2d_backward_weight", kXi, transposed_matrices(Vt, V), matrices(dMt, dM),
                                     matrices(dUt, dU), sum);
                      });
  parallel_for((g.O + kBlock - 1) / kBlock, g.C * g.O * kXi,
               [&](int64_t b, int64_t e) { kernel_gradients(dU, g.C, g.O, b, e, dw); });
}

}  // namespace duet::cpu
