// conv2d on the cpu backend: oneDNN convolution primitives (forward, backward data, backward
// weights with the bias gradient fused; brgemm/jit AVX-512). Channels-last activations are used in
// place; NCHW ones are reordered to the blocked layout the primitive picks (format `any`), since
// oneDNN's plain-NCHW path is im2col+GEMM. Weights always go through a reorder to the primitive's
// blocked layout in a per-thread scratch buffer (and the weight gradient back). oneDNN's dilation
// is PyTorch's - 1. Depthwise shapes oneDNN has no depthwise kernel for run on duet's own
// (depthwise.h); pointwise ones on small maps, long pointwise weight-gradient sums and small-map
// bf16 weight gradients run as matrix products, and conv_algorithm.h says
// which algorithm each pass gets (fixed rules, or autotuned). See docs/cpu_backend.md for the
// measured layout trade-off. bf16 (autocast) runs the same primitives with bf16 memory and f32
// accumulation, except Winograd, which computes in f32 between converting reorders; f16 goes to
// the reference backend (lowp_on_reference in common.h says why).
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <utility>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_algorithm.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/gemm.h"

namespace duet {
namespace cpu {
namespace {
std::atomic<KernelPolicy> g_winograd{policy_from_env("DUET_WINOGRAD")};
std::atomic<KernelPolicy> g_pointwise_gemm{policy_from_env("DUET_POINTWISE_GEMM")};
std::atomic<KernelPolicy> g_im2col_wgrad{policy_from_env("DUET_IM2COL_WGRAD")};
std::atomic<bool> g_autotune{[] {
  const char* v = std::getenv("DUET_CONV_AUTOTUNE");
  return v != nullptr && std::string(v) == "1";
}()};
}  // namespace

void set_winograd_policy(KernelPolicy p) { g_winograd.store(p); }
KernelPolicy winograd_policy() { return g_winograd.load(); }
void set_pointwise_gemm_policy(KernelPolicy p) { g_pointwise_gemm.store(p); }
KernelPolicy pointwise_gemm_policy() { return g_pointwise_gemm.load(); }
void set_im2col_weight_gradient_policy(KernelPolicy p) { g_im2col_wgrad.store(p); }
KernelPolicy im2col_weight_gradient_policy() { return g_im2col_wgrad.load(); }

bool winograd_applicable(const Tensor& x, const Tensor& w, const Conv2dParams& p) {
  return (x.dtype() == DType::f32 || x.dtype() == DType::bf16) && p.groups == 1 && w.size(2) == 3 &&
         w.size(3) == 3 && p.stride_h == 1 && p.stride_w == 1 && p.dilation_h == 1 && p.dilation_w == 1;
}

bool bf16_on_amx() {
  static const bool amx = onednn_isa_at_least(dnnl::cpu_isa::avx512_core_amx);
  return amx;
}

bool winograd_wanted(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  const KernelPolicy pol = winograd_policy();
  if (pol == KernelPolicy::never || !winograd_applicable(x, w, p)) return false;
  if (pol == KernelPolicy::always) return true;
  // Winograd's transforms work on 16-channel blocks: with fewer than 32 channels on either side
  // they cost more than they save (a 3-channel stem ran 4.6 ms forward against 0.9 ms direct;
  // 16->16 at 32x32 1.9 against 0.9 ms; 32->32 at 16x16 0.58 against 0.72 ms).
  if (w.size(0) < 32 || w.size(1) < 32) return false;
  // bf16 tensors in f32 Winograd (conv_algorithm.h): only on avx512_bf16 without AMX, where both
  // sides have 256 channels or more and the output map at least 8x8.
  if (x.dtype() == DType::bf16)
    return !bf16_on_amx() && w.size(0) >= 256 && w.size(1) >= 256 && y.size(2) >= 8 && y.size(3) >= 8;
  // Below 4x4 outputs the transform tiles are mostly padding: DenseNet's 128->32 at 2x2 ran 0.16 ms
  // forward against 0.06 ms direct.
  return y.size(2) >= 4 && y.size(3) >= 4;
}

bool pointwise_gemm_applicable(const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  const bool shape = p.groups == 1 && w.size(2) == 1 && w.size(3) == 1 && p.stride_h == 1 && p.stride_w == 1 &&
                     p.pad_h == 0 && p.pad_w == 0;
  // Pixel rows of C channels each, and the weights as a row-major [O, C] matrix (a dense 1x1
  // kernel is that in both weight layouts).
  return shape && x.is_contiguous(MemoryFormat::channels_last) && y.is_contiguous(MemoryFormat::channels_last) &&
         w.stride(1) == 1 && w.stride(0) == w.size(1);
}

bool pointwise_gemm_wanted(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  const KernelPolicy pol = pointwise_gemm_policy();
  if (pol == KernelPolicy::never || !pointwise_gemm_applicable(x, w, y, p)) return false;
  const int64_t rows = x.size(0) * x.size(2) * x.size(3);
  // The bf16 rule was measured on avx512_bf16 only (conv_algorithm.h); AMX has other kernels.
  const bool bf16_weight_gradient =
      pass == ConvPass::backward_weight && x.dtype() == DType::bf16 && !bf16_on_amx();
  return pol == KernelPolicy::always || rows <= 1024 || (pass != ConvPass::forward && rows >= 32768) ||
         (bf16_weight_gradient && rows >= 4096);
}

bool im2col_weight_gradient_applicable(const Tensor& x, const Tensor& dw, const Tensor& dy, const Conv2dParams& p) {
  return p.groups == 1 && (dw.size(2) > 1 || dw.size(3) > 1) && (x.dtype() == DType::f32 || x.dtype() == DType::bf16) &&
         x.is_contiguous(MemoryFormat::channels_last) && dy.is_contiguous(MemoryFormat::channels_last);
}

bool im2col_weight_gradient_wanted(const Tensor& x, const Tensor& dw, const Tensor& dy, const Conv2dParams& p) {
  const KernelPolicy pol = im2col_weight_gradient_policy();
  if (pol == KernelPolicy::never || !im2col_weight_gradient_applicable(x, dw, dy, p)) return false;
  if (pol == KernelPolicy::always) return true;
  const int64_t pixels = dy.size(2) * dy.size(3);
  return x.dtype() == DType::bf16 ? pixels <= 16 : pixels <= 64 && !winograd_wanted(x, dw, dy, p);
}
}  // namespace cpu

using namespace cpu;

namespace {

struct ConvGeometry {
  dims strides, dilates, pad_l, pad_r;
};

ConvGeometry geometry(const Conv2dParams& p) {
  // Symmetric padding satisfies oneDNN's output-size rule whenever PyTorch's formula gives the
  // output size (the rule floors, like PyTorch's).
  return {{p.stride_h, p.stride_w}, {p.dilation_h - 1, p.dilation_w - 1}, {p.pad_h, p.pad_w}, {p.pad_h, p.pad_w}};
}

// The user's weights [O, I/g, KH, KW] (any dense strides), as oneDNN's [g, O/g, I/g, KH, KW] when
// grouped.
dnnl::memory::desc weights_md(const Tensor& w, int64_t groups) {
  if (groups == 1) return md_of(w);
  const Shape& s = w.shape();
  const Shape& st = w.strides();
  return dnnl::memory::desc({groups, s[0] / groups, s[1], s[2], s[3]}, dt_of(w.dtype()),
                            dims{st[0] * (s[0] / groups), st[0], st[1], st[2], st[3]});
}
dnnl::memory::desc weights_any(const Shape& s, int64_t groups, DType t) {
  if (groups == 1) return dnnl::memory::desc(to_dims(s), dt_of(t), tag::any);
  return dnnl::memory::desc({groups, s[0] / groups, s[1], s[2], s[3]}, dt_of(t), tag::any);
}
dnnl::memory::desc bias_md(const Tensor& b) {
  return dnnl::memory::desc({b.size(0)}, dt_of(b.dtype()), dims{b.stride(0)});
}
// The bias (or its gradient) as a primitive computing in `compute` is built with: the user's own,
// or a dense one in f32 where Winograd computes bf16 tensors in f32 (a reorder converts it).
dnnl::memory::desc bias_md(const Tensor& b, DType compute, DType tensors) {
  return compute == tensors ? bias_md(b) : dnnl::memory::desc({b.size(0)}, dt_of(compute), tag::a);
}

// The type a primitive computes in: the tensors' own, except Winograd, which oneDNN 2.6 has in
// f32 only; bf16 tensors are converted by the reorders into and out of its blocked layout, which
// Winograd pays for anyway (conv_algorithm.h).
DType compute_dtype(dnnl::algorithm alg, DType t) {
  return alg == dnnl::algorithm::convolution_winograd ? DType::f32 : t;
}

dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::memory::desc& x, const dnnl::memory::desc& w,
                                                     const dnnl::memory::desc* bias, const dnnl::memory::desc& y,
                                                     const Conv2dParams& p,
                                                     dnnl::algorithm alg = dnnl::algorithm::convolution_direct,
                                                     bool relu = false, bool jit_for_thin_input = false) {
  const ConvGeometry g = geometry(p);
  const auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, w, *bias, y,
                                                        g.strides, g.dilates, g.pad_l, g.pad_r)
                      : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, w, y, g.strides,
                                                        g.dilates, g.pad_l, g.pad_r);
  dnnl::primitive_attr attr;
  if (relu) {
    // The fused ReLU as a post-op: applied to each output tile while it is still in registers.
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  dnnl::convolution_forward::primitive_desc pd(d, attr, engine());
  // oneDNN 2.6 lists brgconv first for NHWC, but with fewer than 16 input channels per group (an
  // RGB stem) its jit kernel is faster: 0.75 against 0.93 ms for CIFAR's 3->64 stem forward (batch
  // 64, 2 threads). The implementation list is walked on a second descriptor, so the first stays as
  // it was when no jit kernel is offered. This has to happen here: oneDNN 2.6's iterator keeps a
  // pointer to `d`, so next_impl() after this function returned would read a dead descriptor.
  const dnnl::memory::dims wd = w.dims();  // [O, I, KH, KW], or [g, O/g, I/g, KH, KW] when grouped
  if (!jit_for_thin_input || wd[wd.size() - 3] >= 16 || std::string(pd.impl_info_str()).rfind("brgconv", 0) != 0)
    return pd;
  dnnl::convolution_forward::primitive_desc alt(d, attr, engine());
  while (alt.next_impl())
    if (std::string(alt.impl_info_str()).rfind("jit:", 0) == 0) return alt;
  return pd;
}

// Builds a primitive with Winograd when the policy asks for it and oneDNN has a kernel for the
// shape, else with direct convolution: make(alg, blocked) creates the primitive descriptors and
// throws dnnl::error when oneDNN has no implementation.
template <class Make>
auto with_algorithm(bool winograd, bool direct_blocked, Make make) {
  if (winograd) {
    try {
      return make(dnnl::algorithm::convolution_winograd, true);
    } catch (const dnnl::error&) {
      // no Winograd kernel for these channel counts or this ISA: direct below
    }
  }
  return make(dnnl::algorithm::convolution_direct, direct_blocked);
}

Key conv_key(const char* tag, const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d, const Conv2dParams& p) {
  Key k(tag);
  k.add(a).add(b).add(c).add(d);
  k.add(p.stride_h).add(p.stride_w).add(p.pad_h).add(p.pad_w).add(p.dilation_h).add(p.dilation_w).add(p.groups);
  return k;
}

// Channels-last f32 activations into oneDNN's nChw16c (aBcd16b: 16-channel blocks, each a plane of
// 16-float pixels), the layout of its Winograd and blocked direct kernels, for C a multiple of 16.
// One pass, each thread writing whole blocks in order. oneDNN 2.6's reorder (jit:uni) took 1.5x as
// long in this direction (docs/cpu_backend.md); the other direction it does as fast as a loop.
bool nhwc_to_blocked16_applies(const dnnl::memory::desc& user, const dnnl::memory::desc& prim) {
  using tag = dnnl::memory::format_tag;
  const dnnl::memory::dims d = user.dims();
  return d.size() == 4 && d[1] % 16 == 0 && user == dnnl::memory::desc(d, dnnl::memory::data_type::f32, tag::acdb) &&
         prim == dnnl::memory::desc(d, dnnl::memory::data_type::f32, tag::aBcd16b);
}
void nhwc_to_blocked16(const float* src, float* dst, int64_t N, int64_t C, int64_t HW) {
  const int64_t CB = C / 16;
  parallel_for(N * CB, N * C * HW, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {  // block i = (image n, channel block cb)
      const float* s = src + (i / CB) * HW * C + (i % CB) * 16;
      float* d = dst + i * HW * 16;
      for (int64_t px = 0; px < HW; ++px) {
#pragma omp simd
        for (int k = 0; k < 16; ++k) d[px * 16 + k] = s[px * C + k];
      }
    }
  });
}

// A tensor as the primitive wants it: the user's memory itself, or a reorder between it and a
// scratch buffer in the primitive's layout (user -> primitive for inputs, back for outputs).
struct Reordered {
  bool needed = false;
  bool to_blocked16 = false;  // an input reordered by nhwc_to_blocked16 instead of `reorder`
  dnnl::memory::desc user, prim;
  dnnl::reorder reorder;
};
Reordered reordered(const dnnl::memory::desc& user, const dnnl::memory::desc& prim, bool output) {
  Reordered r;
  r.user = user;
  r.prim = prim;
  r.needed = user != prim;
  r.to_blocked16 = r.needed && !output && nhwc_to_blocked16_applies(user, prim);
  if (r.needed && !r.to_blocked16)
    r.reorder = output ? dnnl::reorder(dnnl::reorder::primitive_desc(engine(), prim, engine(), user))
                       : dnnl::reorder(dnnl::reorder::primitive_desc(engine(), user, engine(), prim));
  return r;
}
dnnl::memory input_mem(const Reordered& r, const Tensor& t, int slot) {
  if (!r.needed) return mem(r.user, t);
  dnnl::memory pm = mem(r.prim, scratch(r.prim.get_size(), slot));
  if (r.to_blocked16) {
    const dnnl::memory::dims d = r.user.dims();
    nhwc_to_blocked16(static_cast<const float*>(t.raw_data()), static_cast<float*>(pm.get_data_handle()), d[0], d[1],
                      d[2] * d[3]);
  } else {
    dnnl::memory um = mem(r.user, t);
    r.reorder.execute(stream(), um, pm);
  }
  return pm;
}
dnnl::memory output_mem(const Reordered& r, const Tensor& t, int slot) {
  return r.needed ? mem(r.prim, scratch(r.prim.get_size(), slot)) : mem(r.user, t);
}
void finish_output(const Reordered& r, dnnl::memory& pm, const Tensor& t) {
  if (!r.needed) return;
  dnnl::memory um = mem(r.user, t);
  r.reorder.execute(stream(), pm, um);
}

// ---- dy shared by a layer's two backward passes ----------------------------------------------
// Autograd dispatches a convolution's data gradient and, as the very next kernel, its weight
// gradient, both with the same dy (engine/ops/conv.cpp). Where both primitives want dy in the same
// blocked layout (Winograd's, for channels-last tensors), the weight gradient takes the copy the
// data gradient reordered into the dy scratch slot instead of reordering dy again: one pass over
// dy less per layer (resnet18_cifar: 13 layers, about 110 MB per step in f32). The copy is trusted
// only if nothing was dispatched between the two passes (dispatched_kernels()): then neither dy nor
// the slot (which a forward's blocked output also passes through) can have changed. And only for
// the same memory in the same layouts.
constexpr int kDySlot = 2;
constexpr int kConvBiasSlot = 5;  // a bias (or its gradient) converted for f32 Winograd
struct ReorderedDy {
  uint64_t kernel = 0;  // dispatched_kernels() during the data gradient that made it
  const void* data = nullptr;
  dnnl::memory::desc user, prim;
};
thread_local ReorderedDy t_reordered_dy;

dnnl::memory dy_for_data_gradient(const Reordered& r, const Tensor& dy) {
  dnnl::memory m = input_mem(r, dy, kDySlot);
  if (r.needed) t_reordered_dy = {dispatched_kernels(), dy.raw_data(), r.user, r.prim};
  return m;
}
// Whether the dy slot holds dy as the weight gradient's primitive `r` wants it; the data gradient's
// record is used up either way.
bool dy_reordered_by_data_gradient(const Reordered& r, const Tensor& dy) {
  const ReorderedDy made = std::exchange(t_reordered_dy, ReorderedDy{});
  return r.needed && made.kernel + 1 == dispatched_kernels() && made.data == dy.raw_data() && made.user == r.user &&
         made.prim == r.prim;
}

// Channels-last activations are handed to oneDNN as they are (its brgemm/jit kernels run NHWC at
// full speed). Plain NCHW would select the slow im2col+GEMM path, so there the primitive picks its
// own (blocked nChw16c) layout and the activations are reordered around it: two cheap passes
// instead of a 2-5x slower convolution.
dnnl::memory::desc activation_md(const Tensor& t, bool blocked, DType compute) {
  const bool nhwc = t.size(1) > 1 && t.stride(1) == 1;
  if (nhwc && !blocked && compute == t.dtype()) return md_of(t);
  return dnnl::memory::desc(to_dims(t.shape()), dt_of(compute), tag::any);
}

// The one place where the blocked layout beats NHWC here: the forward pass of a dense KxK
// convolution (K > 1) whose output map has at most 16 pixels. oneDNN 2.6 picks its brgconv
// kernel for NHWC there and reaches about half of what its jit kernel does on nChw16c (2
// threads, batch 64: ResNet's 512->512 at 4x4 ran 234 against 447 GFLOP/s, 256->512 stride 2
// from 8x8 381 against 497, DenseNet's 128->32 at 2x2 342 against 446); from 8x8 outputs up NHWC
// is as fast or faster (256->256 at 8x8: 514 against 450). The two reorders around it move ~4 MB
// at most. The backward passes stay NHWC: there the blocked kernels are not faster.
// (bench/onednn_conv_algos.cpp measures each variant; docs/cpu_backend.md has the tables.)
bool blocked_forward(const Tensor& w, const Tensor& y, const Conv2dParams& p) {
  return p.groups == 1 && (w.size(2) > 1 || w.size(3) > 1) && y.size(2) * y.size(3) <= 16;
}

// oneDNN's kernels made for depthwise convolution are named "jit_dw" and "brdgmm_dw"; any other
// choice for a depthwise shape (im2col + GEMM, reference loops, or the dense grouped-conv jit
// that computes 16x16 channel blocks of which one diagonal is used) is its fallback.
template <class PD>
bool generic_impl(const PD& pd) {
  return std::string(pd.impl_info_str()).find("_dw") == std::string::npos;
}

// Depthwise convolutions run on duet's own kernels (depthwise.h) when the policy says always, or,
// under the automatic policy, when oneDNN's choice for the shape is one of its generic paths.
bool own_depthwise_always(bool applicable) { return applicable && depthwise_policy() == KernelPolicy::always; }
template <class PD>
bool own_depthwise_instead_of(bool applicable, const PD& pd) {
  return applicable && depthwise_policy() == KernelPolicy::automatic && generic_impl(pd);
}
constexpr const char* kOwnDepthwise = "duet:depthwise_nhwc";

struct ConvFwd {
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  Reordered x, w, bias, y;
};
struct ConvBwdData {
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data prim;
  Reordered dy, w, dx;
};
struct ConvBwdWeights {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights prim;
  Reordered x, dy, dw, dbias;
};

// Pointwise convolutions as matrix products (conv_algorithm.h): the maps as [P = N*H*W, C] pixel
// rows, the weights as the row-major [O, C] matrix.
MatrixOperand pixel_rows(const Tensor& t) {
  const int64_t rows = t.size(0) * t.size(2) * t.size(3), C = t.size(1);
  return {t, rows, C, C, 1};
}
MatrixOperand weight_matrix(const Tensor& w, bool transposed) {
  const int64_t O = w.size(0), C = w.size(1);
  return transposed ? MatrixOperand{w, C, O, 1, C} : MatrixOperand{w, O, C, C, 1};
}
MatrixOperand transposed(const MatrixOperand& m) { return {m.t, m.cols, m.rows, m.col, m.row, m.batch_stride}; }
// y = x W^T (+ bias) (then ReLU)
void pointwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, bool relu) {
  gemm("conv2d", pixel_rows(x), weight_matrix(w, true), pixel_rows(y), bias, relu);
}
// dx = dy W
void pointwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  gemm("conv2d_backward_data", pixel_rows(dy), weight_matrix(w, false), pixel_rows(dx), Tensor(), false);
}
// How many chunks the P pixel rows of a weight gradient are summed in: one per thread while each
// keeps at least kMinChunkRows rows and all are the same size (a batched product's matrices are).
int64_t weight_gradient_chunks(int64_t P) {
  constexpr int64_t kMinChunkRows = 1024;
  int64_t chunks = max_threads();
  while (chunks > 1 && (P % chunks != 0 || P / chunks < kMinChunkRows)) --chunks;
  return chunks;
}

// dW = dy^T x, a sum over the P = N*H*W pixel rows. oneDNN's matmul splits a product's work by
// blocks of its result and not along its sum, so a long sum into a small [O, C] result (ResNet-50
// at 32x32: 65,536 rows, 64 or 256 channels) leaves threads idle or copying. A long sum is
// therefore cut into one chunk per thread: one batched product writes each chunk's partial
// result, and the partials are added. The operand with fewer channels is the one read transposed
// (oneDNN copies that operand into its own layout first, so the smaller copy is cheaper): the
// partials are [O, C] = dy^T x when O <= C, else [C, O] = x^T dy, transposed as they are added.
void pointwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw) {
  MatrixOperand xr = pixel_rows(x), dyr = pixel_rows(dy);
  const int64_t P = xr.rows, chunks = weight_gradient_chunks(P);
  if (chunks == 1)
    return gemm("conv2d_backward_weight", transposed(dyr), xr, weight_matrix(dw, false), Tensor(), false);
  const int64_t rows = P / chunks, O = dw.size(0), C = dw.size(1);
  xr.rows = dyr.rows = rows;
  xr.batch_stride = rows * C;
  dyr.batch_stride = rows * O;
  const bool o_first = O <= C;
  const MatrixOperand& a = o_first ? dyr : xr;
  const MatrixOperand& b = o_first ? xr : dyr;
  const Tensor part = Tensor::empty({chunks, a.cols, b.cols});
  gemm_batched("conv2d_backward_weight", chunks, transposed(a), b,
               {part, a.cols, b.cols, b.cols, 1, a.cols * b.cols});
  float* sum = part.data<float>();
  const int64_t n = a.cols * b.cols;
  parallel_for(n, n * chunks, [&](int64_t lo, int64_t hi) {
    for (int64_t k = 1; k < chunks; ++k) {
      const float* pk = sum + k * n;
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) sum[i] += pk[i];
    }
  });
  const Tensor total = part.select(0, 0);
  cpu_backend().copy(o_first ? total : total.transpose(0, 1), dw.view({O, C}));
}

// x's im2col matrix, [P = N*OH*OW, KH*KW*C]: row (n, oh, ow) holds the receptive field of that
// output pixel, tap by tap, each tap the C channels of one input pixel (zeros outside the map).
void im2col_nhwc(const Tensor& x, const Tensor& col, int64_t OH, int64_t OW, int64_t KH, int64_t KW,
                 const Conv2dParams& p) {
  const int64_t H = x.size(2), W = x.size(3), C = x.size(1), P = x.size(0) * OH * OW;
  const size_t es = dtype_size(x.dtype()), tap = static_cast<size_t>(C) * es;
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(col.raw_data());
  parallel_for(P, P * KH * KW * C, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / (OH * OW), oh = r / OW % OH, ow = r % OW;
      char* row = dst + static_cast<size_t>(r * KH * KW) * tap;
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw, row += tap) {
          const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
          const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
          if (ih < 0 || ih >= H || iw < 0 || iw >= W) std::memset(row, 0, tap);
          else std::memcpy(row, src + static_cast<size_t>((n * H + ih) * W + iw) * tap, tap);
        }
    }
  });
}

// dW = dy^T im2col(x) (conv_algorithm.h), straight into a channels-last weight gradient (its
// memory is the [O, KH*KW*C] matrix), else through a scratch matrix copied into dw's layout.
void im2col_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p) {
  const int64_t O = dw.size(0), C = dw.size(1), KH = dw.size(2), KW = dw.size(3), K = KH * KW * C;
  const int64_t P = dy.size(0) * dy.size(2) * dy.size(3);
  const Tensor col = Tensor::empty({P, K}, TensorOptions(x.dtype()));
  im2col_nhwc(x, col, dy.size(2), dy.size(3), KH, KW, p);
  const Tensor ohwi = dw.permute({0, 2, 3, 1});
  const bool in_place = ohwi.is_contiguous();
  const Tensor out = in_place ? dw : Tensor::empty({O, KH, KW, C}, TensorOptions(dw.dtype()));
  gemm("conv2d_backward_weight", transposed(pixel_rows(dy)), {col, P, K, K, 1}, {out, O, K, K, 1}, Tensor(), false);
  if (!in_place) cpu_backend().copy(out, ohwi);
}

void own_depthwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                           const Conv2dParams& p) {
  profiler::note_impl(kOwnDepthwise);
  depthwise_forward(x, w, bias, y, p);
  if (p.relu) cpu_backend().activation(Activation::relu, 0.0, y, y);
}
void own_depthwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  profiler::note_impl(kOwnDepthwise);
  depthwise_backward_data(dy, w, dx, p);
}
void own_depthwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                                   const Conv2dParams& p) {
  profiler::note_impl(kOwnDepthwise);
  depthwise_backward_weight(x, dy, dw, dbias, p);
}

// ---- each pass with a given algorithm ----------------------------------------------------------
// winograd falls back to direct where oneDNN has no Winograd kernel for the shape (with_algorithm);
// direct falls back to duet's own depthwise loops where oneDNN has only a generic kernel for a
// depthwise shape (own_depthwise_instead_of).

void run_forward(ConvAlgo a, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y,
                 const Conv2dParams& p) {
  if (a == ConvAlgo::matmul) return pointwise_forward(x, w, bias, y, p.relu);
  // Where oneDNN has no Winograd kernel, the rule's fallback for small maps is the blocked layout.
  const bool wino = a == ConvAlgo::winograd;
  const bool blocked = a == ConvAlgo::direct_blocked || (wino && blocked_forward(w, y, p));
  Key key = conv_key("conv_fwd", x, w, bias, y, p);
  key.add(int64_t(p.relu)).add(static_cast<int64_t>(a));
  auto e = cached<ConvFwd>(key, [&] {
    ConvFwd r;
    r.pd = with_algorithm(wino, blocked, [&](dnnl::algorithm alg, bool blocked_layout) {
      const DType t = compute_dtype(alg, x.dtype());
      const auto b = bias.defined() ? bias_md(bias, t, x.dtype()) : dnnl::memory::desc();
      return forward_pd(activation_md(x, blocked_layout, t), weights_any(w.shape(), p.groups, t),
                        bias.defined() ? &b : nullptr, activation_md(y, blocked_layout, t), p, alg, p.relu, true);
    });
    r.prim = dnnl::convolution_forward(r.pd);
    r.x = reordered(md_of(x), r.pd.src_desc(), false);
    r.w = reordered(weights_md(w, p.groups), r.pd.weights_desc(), false);
    if (bias.defined()) r.bias = reordered(bias_md(bias), r.pd.bias_desc(), false);
    r.y = reordered(md_of(y), r.pd.dst_desc(), true);
    return r;
  });
  if (own_depthwise_instead_of(depthwise_applicable(x, w, y, p), e->pd))
    return own_depthwise_forward(x, w, bias, y, p);
  note(e->pd);
  dnnl::memory ym = output_mem(e->y, y, 2);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, input_mem(e->x, x, 1)}, {DNNL_ARG_WEIGHTS, input_mem(e->w, w, 0)}, {DNNL_ARG_DST, ym}};
  if (bias.defined()) args.emplace(DNNL_ARG_BIAS, input_mem(e->bias, bias, kConvBiasSlot));
  e->prim.execute(stream(), args);
  finish_output(e->y, ym, y);
}

void run_backward_data(ConvAlgo a, const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  if (a == ConvAlgo::matmul) return pointwise_backward_data(dy, w, dx);
  const bool wino = a == ConvAlgo::winograd;
  Key key = conv_key("conv_bwd_data", dy, w, dx, Tensor(), p);
  key.add(static_cast<int64_t>(a));
  auto e = cached<ConvBwdData>(key, [&] {
    ConvBwdData r;
    const ConvGeometry g = geometry(p);
    r.pd = with_algorithm(wino, false, [&](dnnl::algorithm alg, bool blocked) {
      const DType t = compute_dtype(alg, dy.dtype());
      const auto wa = weights_any(w.shape(), p.groups, t);
      const auto dxa = activation_md(dx, blocked, t), dya = activation_md(dy, blocked, t);
      const auto hint = forward_pd(dxa, wa, nullptr, dya, p, alg);
      return dnnl::convolution_backward_data::primitive_desc(
          dnnl::convolution_backward_data::desc(alg, dxa, wa, dya, g.strides, g.dilates, g.pad_l, g.pad_r), engine(),
          hint);
    });
    r.prim = dnnl::convolution_backward_data(r.pd);
    r.dy = reordered(md_of(dy), r.pd.diff_dst_desc(), false);
    r.w = reordered(weights_md(w, p.groups), r.pd.weights_desc(), false);
    r.dx = reordered(md_of(dx), r.pd.diff_src_desc(), true);
    return r;
  });
  if (own_depthwise_instead_of(depthwise_applicable(dx, w, dy, p), e->pd))
    return own_depthwise_backward_data(dy, w, dx, p);
  note(e->pd);
  dnnl::memory dxm = output_mem(e->dx, dx, 1);
  e->prim.execute(stream(), {{DNNL_ARG_DIFF_DST, dy_for_data_gradient(e->dy, dy)},
                             {DNNL_ARG_WEIGHTS, input_mem(e->w, w, 0)},
                             {DNNL_ARG_DIFF_SRC, dxm}});
  finish_output(e->dx, dxm, dx);
}

void run_backward_weight(ConvAlgo a, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                         const Conv2dParams& p) {
  if (a == ConvAlgo::matmul)
    return dw.size(2) == 1 && dw.size(3) == 1 ? pointwise_backward_weight(x, dy, dw) : im2col_backward_weight(x, dy, dw, p);
  const bool wino = a == ConvAlgo::winograd;
  Key key = conv_key("conv_bwd_w", x, dy, dw, dbias, p);
  key.add(static_cast<int64_t>(a));
  auto e = cached<ConvBwdWeights>(key, [&] {
    ConvBwdWeights r;
    const ConvGeometry g = geometry(p);
    r.pd = with_algorithm(wino, false, [&](dnnl::algorithm alg, bool blocked) {
      const DType t = compute_dtype(alg, x.dtype());
      const auto wa = weights_any(dw.shape(), p.groups, t);
      const auto db = dbias.defined() ? bias_md(dbias, t, x.dtype()) : dnnl::memory::desc();
      const auto xa = activation_md(x, blocked, t), dya = activation_md(dy, blocked, t);
      const auto hint = forward_pd(xa, wa, dbias.defined() ? &db : nullptr, dya, p, alg);
      const auto d = dbias.defined() ? dnnl::convolution_backward_weights::desc(alg, xa, wa, db, dya, g.strides,
                                                                                g.dilates, g.pad_l, g.pad_r)
                                     : dnnl::convolution_backward_weights::desc(alg, xa, wa, dya, g.strides,
                                                                                g.dilates, g.pad_l, g.pad_r);
      return dnnl::convolution_backward_weights::primitive_desc(d, engine(), hint);
    });
    r.prim = dnnl::convolution_backward_weights(r.pd);
    r.x = reordered(md_of(x), r.pd.src_desc(), false);
    r.dy = reordered(md_of(dy), r.pd.diff_dst_desc(), false);
    r.dw = reordered(weights_md(dw, p.groups), r.pd.diff_weights_desc(), true);
    if (dbias.defined()) r.dbias = reordered(bias_md(dbias), r.pd.diff_bias_desc(), true);
    return r;
  });
  if (own_depthwise_instead_of(depthwise_applicable(x, dw, dy, p), e->pd))
    return own_depthwise_backward_weight(x, dy, dw, dbias, p);
  const bool dy_ready = dy_reordered_by_data_gradient(e->dy, dy);
  if (profiler::enabled())
    profiler::note_impl(std::string(e->pd.impl_info_str()) + (dy_ready ? " (dy as reordered for backward_data)" : ""));
  dnnl::memory dwm = output_mem(e->dw, dw, 0);
  const dnnl::memory dym =
      dy_ready ? mem(e->dy.prim, scratch(e->dy.prim.get_size(), kDySlot)) : input_mem(e->dy, dy, kDySlot);
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, input_mem(e->x, x, 1)}, {DNNL_ARG_DIFF_DST, dym}, {DNNL_ARG_DIFF_WEIGHTS, dwm}};
  dnnl::memory dbm = dbias.defined() ? output_mem(e->dbias, dbias, kConvBiasSlot) : dnnl::memory();
  if (dbias.defined()) args.emplace(DNNL_ARG_DIFF_BIAS, dbm);
  e->prim.execute(stream(), args);
  finish_output(e->dw, dwm, dw);
  if (dbias.defined()) finish_output(e->dbias, dbm, dbias);
}

// ---- which algorithm ------------------------------------------------------------------------------

// A weight gradient that also sums the bias gradient keeps the convolution kernel, which fuses it.
bool pointwise_allowed(ConvPass pass, bool bias_gradient) {
  return !(pass == ConvPass::backward_weight && bias_gradient);
}
bool im2col_allowed(ConvPass pass, bool bias_gradient) {
  return pass == ConvPass::backward_weight && !bias_gradient;
}

// The fixed rules (conv_algorithm.h): matmul for small pointwise maps and long pointwise weight
// gradients, and im2col + matmul for small-map bf16 weight gradients; Winograd for dense 3x3
// layers, the blocked layout for forwards onto small maps, else direct on the tensors' layout.
ConvAlgo rule_of(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dParams& p,
                 bool bias_gradient) {
  if (pointwise_allowed(pass, bias_gradient) && pointwise_gemm_wanted(pass, x, w, y, p))
    return ConvAlgo::matmul;
  if (im2col_allowed(pass, bias_gradient) && im2col_weight_gradient_wanted(x, w, y, p)) return ConvAlgo::matmul;
  if (winograd_wanted(x, w, y, p)) return ConvAlgo::winograd;
  if (pass == ConvPass::forward && blocked_forward(w, y, p)) return ConvAlgo::direct_blocked;
  return ConvAlgo::direct;
}

// Every algorithm that can run the pass (a policy set to never rules its algorithm out).
std::vector<ConvAlgo> candidates(ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y,
                                 const Conv2dParams& p, bool bias_gradient) {
  std::vector<ConvAlgo> c{ConvAlgo::direct};
  if (pass == ConvPass::forward && p.groups == 1 && (w.size(2) > 1 || w.size(3) > 1))
    c.push_back(ConvAlgo::direct_blocked);
  if (winograd_policy() != KernelPolicy::never && winograd_applicable(x, w, p)) c.push_back(ConvAlgo::winograd);
  if (pointwise_gemm_policy() != KernelPolicy::never && pointwise_gemm_applicable(x, w, y, p) &&
      pointwise_allowed(pass, bias_gradient))
    c.push_back(ConvAlgo::matmul);
  if (im2col_weight_gradient_policy() != KernelPolicy::never && im2col_weight_gradient_applicable(x, w, y, p) &&
      im2col_allowed(pass, bias_gradient))  // kernels larger than 1x1: never both
    c.push_back(ConvAlgo::matmul);
  return c;
}

std::mutex g_tuned_mutex;
std::unordered_map<std::string, ConvAlgo> g_tuned;  // guarded by g_tuned_mutex
std::atomic<int64_t> g_tuning_runs{0};

// The algorithm for this pass: the rule's, or with autotuning on, the fastest candidate on this
// machine for this shape, timed once on the call's own tensors (run(algo) executes the pass) and
// remembered. A candidate that fails to build is skipped.
// make_key() builds the shape's key, only when autotuning needs it.
template <class MakeKey, class Run>
ConvAlgo choose(ConvPass pass, MakeKey make_key, const Tensor& x, const Tensor& w, const Tensor& y,
                const Conv2dParams& p, bool bias_gradient, Run run) {
  const ConvAlgo rule = rule_of(pass, x, w, y, p, bias_gradient);
  if (!conv_autotune()) return rule;
  const std::vector<ConvAlgo> cands = candidates(pass, x, w, y, p, bias_gradient);
  if (cands.size() < 2) return rule;
  Key key = make_key();
  key.add(static_cast<int64_t>(pass)).add(int64_t(bias_gradient)).add(int64_t(p.relu));
  {
    std::lock_guard<std::mutex> lock(g_tuned_mutex);
    if (auto it = g_tuned.find(key.s); it != g_tuned.end()) return it->second;
  }
  ConvAlgo best = rule;
  double best_ns = std::numeric_limits<double>::infinity();
  for (ConvAlgo c : cands) {
    std::array<double, 3> ns{};
    try {
      run(c);  // builds the primitive and warms the caches
      for (double& t : ns) {
        const auto t0 = std::chrono::steady_clock::now();
        run(c);
        t = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
      }
    } catch (const dnnl::error&) {
      continue;
    } catch (const Error&) {
      continue;
    }
    g_tuning_runs.fetch_add(4);
    std::sort(ns.begin(), ns.end());
    if (ns[1] < best_ns) {
      best_ns = ns[1];
      best = c;
    }
  }
  std::lock_guard<std::mutex> lock(g_tuned_mutex);
  g_tuned.emplace(key.s, best);
  return best;
}

}  // namespace

namespace cpu {
void set_conv_autotune(bool on) { g_autotune.store(on); }
bool conv_autotune() { return g_autotune.load(); }
int64_t conv_autotune_runs() { return g_tuning_runs.load(); }
}  // namespace cpu

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  if (y.numel() == 0) return;
  guarded("conv2d", {&x, &w, &bias}, [&] {
    if (own_depthwise_always(depthwise_applicable(x, w, y, p))) return own_depthwise_forward(x, w, bias, y, p);
    const auto key = [&] { return conv_key("tune", x, w, bias, y, p); };
    const ConvAlgo a =
        choose(ConvPass::forward, key, x, w, y, p, false, [&](ConvAlgo c) { run_forward(c, x, w, bias, y, p); });
    run_forward(a, x, w, bias, y, p);
  });
}

void CpuBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  if (dx.numel() == 0) return;
  if (dy.numel() == 0) return fill(dx, 0.0);
  guarded("conv2d_backward_data", {&dy, &w, &dx}, [&] {
    if (own_depthwise_always(depthwise_applicable(dx, w, dy, p))) return own_depthwise_backward_data(dy, w, dx, p);
    const auto key = [&] { return conv_key("tune", dy, w, dx, Tensor(), p); };
    const ConvAlgo a = choose(ConvPass::backward_data, key, dx, w, dy, p, false,
                              [&](ConvAlgo c) { run_backward_data(c, dy, w, dx, p); });
    run_backward_data(a, dy, w, dx, p);
  });
}

void CpuBackend::conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                                        const Conv2dParams& p) {
  if (dw.numel() == 0) return;
  if (dy.numel() == 0 || x.numel() == 0) {
    fill(dw, 0.0);
    if (dbias.defined()) fill(dbias, 0.0);
    return;
  }
  guarded("conv2d_backward_weight", {&x, &dy, &dw}, [&] {
    if (own_depthwise_always(depthwise_applicable(x, dw, dy, p)))
      return own_depthwise_backward_weight(x, dy, dw, dbias, p);
    const auto key = [&] { return conv_key("tune", x, dy, dw, dbias, p); };
    const ConvAlgo a = choose(ConvPass::backward_weight, key, x, dw, dy, p, dbias.defined(),
                              [&](ConvAlgo c) { run_backward_weight(c, x, dy, dw, dbias, p); });
    run_backward_weight(a, x, dy, dw, dbias, p);
  });
}

}  // namespace duet
