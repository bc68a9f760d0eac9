// conv2d on the cpu backend: the two entry points (forward, and one backward for the data and weight
// gradients), which plan each pass (planner.h) and run the plan, and oneDNN's convolution primitives
// for the plans that use them: direct, on the blocked layout, Winograd. Channels-last activations
// are used in place; NCHW ones are reordered to the blocked layout the primitive picks (format
// `any`), since oneDNN's plain-NCHW path is im2col+GEMM. Weights always go through a reorder to the
// primitive's blocked layout in a per-thread scratch buffer (and the weight gradient back).
// oneDNN's dilation is PyTorch's - 1. bf16 (autocast) runs the same primitives with bf16 memory and
// f32 accumulation, except Winograd, and every dense layer where this CPU runs bf16 arithmetic in
// f32 (bf16_speed.h): those compute in f32 between converting reorders. The matrix product passes
// are conv_gemm.cpp's, the depthwise loops depthwise.cpp's.
#include <cstring>
#include <optional>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_kernels.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/direct_conv.h"
#include "backends/cpu/winograd_conv.h"
#include "engine/conv_backward.h"
#include "engine/conv_epilogue.h"

namespace duet {
namespace cpu {

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

// The type a primitive computes in: the tensors' own, except for bf16 tensors on Winograd, which
// oneDNN 2.6 has in f32 only (the reorders into and out of its blocked layout, which Winograd pays
// for anyway, convert them: planner.cpp's Winograd rule), and for bf16 layers where this CPU runs
// bf16 arithmetic in f32 (planner.h's bf16_conv_in_f32: the reorders convert in the same way). x, w
// and y: the layer's input, weights and output, whichever pass.
DType compute_dtype(dnnl::algorithm alg, DType t, const Tensor& x, const Tensor& w, const Tensor& y,
                    const Conv2dParams& p) {
  if (t != DType::bf16) return t;
  return alg == dnnl::algorithm::convolution_winograd || bf16_conv_in_f32(x, w, y, p.groups) ? DType::f32 : t;
}

// What a forward primitive applies to its output tile while it is still in registers: the residual
// added, then the activation. The residual comes in one of two ways. oneDNN's binary-add post-op
// reads it where it lies, but oneDNN 2.6 then leaves brgconv for its older jit kernel, which is
// slower on 3x3 layers; the sum post-op keeps brgconv and adds y's old contents, so the residual is
// copied into y first, a pass a 1x1 layer (little arithmetic to hide it in) pays for more than
// for the kernel change. So: binary for 1x1, sum otherwise (measured: journal, 2026-11-29).
enum class ResidualBy { none, sum, binary };
struct FusedEpilogue {
  ResidualBy residual = ResidualBy::none;
  std::optional<Activation> act;
};

dnnl::convolution_forward::primitive_desc forward_pd(const dnnl::memory::desc& x, const dnnl::memory::desc& w,
                                                     const dnnl::memory::desc* bias, const dnnl::memory::desc& y,
                                                     const Conv2dParams& p,
                                                     dnnl::algorithm alg = dnnl::algorithm::convolution_direct,
                                                     FusedEpilogue epi = {}, bool jit_for_thin_input = false) {
  const ConvGeometry g = geometry(p);
  const auto d = bias ? dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, w, *bias, y,
                                                        g.strides, g.dilates, g.pad_l, g.pad_r)
                      : dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, alg, x, w, y, g.strides,
                                                        g.dilates, g.pad_l, g.pad_r);
  dnnl::primitive_attr attr;
  if (epi.residual != ResidualBy::none || epi.act) {
    dnnl::post_ops ops;
    if (epi.residual == ResidualBy::sum) ops.append_sum(1.0f);
    if (epi.residual == ResidualBy::binary) ops.append_binary(dnnl::algorithm::binary_add, y);
    if (epi.act) append_activation(ops, *epi.act);
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

Key conv_key(const char* tag, const Tensor& a, const Tensor& b, const Tensor& c, const Tensor& d, const Conv2dParams& p) {
  Key k(tag);
  k.add(a).add(b).add(c).add(d);
  k.add(p.stride_h).add(p.stride_w).add(p.pad_h).add(p.pad_w).add(p.dilation_h).add(p.dilation_w).add(p.groups);
  return k;
}

// Channels-last f32 activations into oneDNN's nChw16c (aBcd16b: 16-channel blocks, each a plane of
// 16-float pixels), the layout of its Winograd and blocked direct kernels, for C a multiple of 16.
// One pass, each thread writing whole blocks in order. oneDNN 2.6's reorder (jit:uni) took 1.5x as
// long in this direction; the other direction it does as fast as a loop.
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
void reorder_into(const Reordered& r, const Tensor& t, dnnl::memory& pm) {
  if (r.to_blocked16) {
    const dnnl::memory::dims d = r.user.dims();
    nhwc_to_blocked16(static_cast<const float*>(t.raw_data()), static_cast<float*>(pm.get_data_handle()), d[0], d[1],
                      d[2] * d[3]);
  } else {
    dnnl::memory um = mem(r.user, t);
    execute(r.reorder, {{DNNL_ARG_FROM, um}, {DNNL_ARG_TO, pm}});
  }
}
dnnl::memory input_mem(const Reordered& r, const Tensor& t, int slot) {
  if (!r.needed) return mem(r.user, t);
  dnnl::memory pm = mem(r.prim, scratch(r.prim.get_size(), slot));
  reorder_into(r, t, pm);
  return pm;
}
// A weight as the primitive wants it: reordered into scratch at every call, or, for a frozen weight
// (inference: nn::Module::freeze), reordered once and the copy kept (engine/frozen_copies.h) under
// the primitive's cache key, which fixes both layouts. At batch 1 the reorders were a third of a
// resnet18_cifar forward.
dnnl::memory weights_mem(const Reordered& r, const Tensor& w, const std::string& kept_name) {
  if (!r.needed || !w.is_frozen()) return input_mem(r, w, 0);
  return kept_in_layout(w, kept_name, r.prim, [&](dnnl::memory& dst) { reorder_into(r, w, dst); });
}
dnnl::memory output_mem(const Reordered& r, const Tensor& t, int slot) {
  return r.needed ? mem(r.prim, scratch(r.prim.get_size(), slot)) : mem(r.user, t);
}
void finish_output(const Reordered& r, dnnl::memory& pm, const Tensor& t) {
  if (!r.needed) return;
  dnnl::memory um = mem(r.user, t);
  execute(r.reorder, {{DNNL_ARG_FROM, pm}, {DNNL_ARG_TO, um}});
}

// The scratch slots of the convolution's reorders (common.h's scratch): 0 weights, 1 the input
// side, 2 dy (or a forward's blocked output), 5 a bias converted for f32 Winograd.
constexpr int kDySlot = 2;
constexpr int kConvBiasSlot = 5;

// Channels-last activations are handed to oneDNN as they are (its brgemm/jit kernels run NHWC at
// full speed). Plain NCHW would select the slow im2col+GEMM path, so there the primitive picks its
// own (blocked nChw16c) layout and the activations are reordered around it: two cheap passes
// instead of a 2-5x slower convolution.
// A channels-last map computed in another type is converted into a dense channels-last buffer of
// that type, not into the primitive's choice: that choice is oneDNN's blocked layout, a reorder
// slower than the conversion alone, onto kernels no faster than the channels-last ones.
dnnl::memory::desc activation_md(const Tensor& t, bool blocked, DType compute) {
  const bool nhwc = t.size(1) > 1 && t.stride(1) == 1;
  if (nhwc && !blocked) return compute == t.dtype() ? md_of(t) : dnnl::memory::desc(to_dims(t.shape()), dt_of(compute), tag::acdb);
  return dnnl::memory::desc(to_dims(t.shape()), dt_of(compute), tag::any);
}

struct ConvFwd {
  std::string kept_weights;  // a frozen weight's kept copy in the primitive's layout: named by the cache key
  // The residual and activation inside the primitive, or both as passes after it where y is
  // reordered out of the primitive's layout (conv_epilogue.h).
  FusedEpilogue fused;
  bool epilogue_after = false;
  dnnl::convolution_forward::primitive_desc pd;
  dnnl::convolution_forward prim;
  Reordered x, w, bias, y;
};
struct ConvBwdData {
  std::string kept_weights;
  dnnl::convolution_backward_data::primitive_desc pd;
  dnnl::convolution_backward_data prim;
  Reordered dy, w, dx;
};
struct ConvBwdWeights {
  dnnl::convolution_backward_weights::primitive_desc pd;
  dnnl::convolution_backward_weights prim;
  Reordered x, dy, dw, dbias;
};


bool uses_onednn(ConvAlgo a) {
  return a == ConvAlgo::direct || a == ConvAlgo::direct_blocked || a == ConvAlgo::winograd;
}
dnnl::algorithm onednn_algorithm(ConvAlgo a) {
  return a == ConvAlgo::winograd ? dnnl::algorithm::convolution_winograd : dnnl::algorithm::convolution_direct;
}

// The cached primitives of each pass for an algorithm of oneDNN's (Winograd's layout is always the
// blocked one); dnnl::error when oneDNN has no implementation.
std::shared_ptr<const ConvFwd> forward_entry(ConvAlgo a, const Tensor& x, const Tensor& w, const Tensor& bias,
                                             bool residual, const Tensor& y, const Conv2dParams& p) {
  Key key = conv_key("conv_fwd", x, w, bias, y, p);
  const dnnl::algorithm alg = onednn_algorithm(a);
  const DType t = compute_dtype(alg, x.dtype(), x, w, y, p);
  key.add(p.act ? 1 + static_cast<int64_t>(*p.act) : 0).add(int64_t(residual)).add(static_cast<int64_t>(a));
  key.add(static_cast<int64_t>(t));
  return cached<ConvFwd>(key, [&] {
    ConvFwd r;
    r.kept_weights = "onednn weights " + key.str();
    const bool blocked = a != ConvAlgo::direct;
    const auto b = bias.defined() ? bias_md(bias, t, x.dtype()) : dnnl::memory::desc();
    const auto build = [&](FusedEpilogue epi) {
      r.fused = epi;
      r.pd = forward_pd(activation_md(x, blocked, t), weights_any(w.shape(), p.groups, t), bias.defined() ? &b : nullptr,
                        activation_md(y, blocked, t), p, alg, epi, true);
    };
    const bool pointwise = w.size(2) == 1 && w.size(3) == 1;
    build({!residual ? ResidualBy::none : pointwise ? ResidualBy::binary : ResidualBy::sum, p.act});
    if (residual && r.pd.dst_desc() != md_of(y)) {
      // A primitive writing its own layout would add the residual in y's layout to the wrong
      // elements (binary) or whatever its scratch output held (sum).
      build({});
      r.epilogue_after = true;
    }
    r.prim = dnnl::convolution_forward(r.pd);
    r.x = reordered(md_of(x), r.pd.src_desc(), false);
    r.w = reordered(weights_md(w, p.groups), r.pd.weights_desc(), false);
    if (bias.defined()) r.bias = reordered(bias_md(bias), r.pd.bias_desc(), false);
    r.y = reordered(md_of(y), r.pd.dst_desc(), true);
    return r;
  });
}

std::shared_ptr<const ConvBwdData> data_entry(ConvAlgo a, const Tensor& dy, const Tensor& w, const Tensor& dx,
                                              const Conv2dParams& p) {
  Key key = conv_key("conv_bwd_data", dy, w, dx, Tensor(), p);
  const dnnl::algorithm alg = onednn_algorithm(a);
  const DType t = compute_dtype(alg, dy.dtype(), dx, w, dy, p);
  key.add(static_cast<int64_t>(a)).add(static_cast<int64_t>(t));
  return cached<ConvBwdData>(key, [&] {
    ConvBwdData r;
    r.kept_weights = "onednn weights " + key.str();
    const ConvGeometry g = geometry(p);
    const bool blocked = a != ConvAlgo::direct;
    const auto wa = weights_any(w.shape(), p.groups, t);
    const auto dxa = activation_md(dx, blocked, t), dya = activation_md(dy, blocked, t);
    const auto hint = forward_pd(dxa, wa, nullptr, dya, p, alg);
    r.pd = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(alg, dxa, wa, dya, g.strides, g.dilates, g.pad_l, g.pad_r), engine(), hint);
    r.prim = dnnl::convolution_backward_data(r.pd);
    r.dy = reordered(md_of(dy), r.pd.diff_dst_desc(), false);
    r.w = reordered(weights_md(w, p.groups), r.pd.weights_desc(), false);
    r.dx = reordered(md_of(dx), r.pd.diff_src_desc(), true);
    return r;
  });
}

std::shared_ptr<const ConvBwdWeights> weight_entry(ConvAlgo a, const Tensor& x, const Tensor& dy, const Tensor& dw,
                                                   const Tensor& dbias, const Conv2dParams& p) {
  Key key = conv_key("conv_bwd_w", x, dy, dw, dbias, p);
  const dnnl::algorithm alg = onednn_algorithm(a);
  const DType t = compute_dtype(alg, x.dtype(), x, dw, dy, p);
  key.add(static_cast<int64_t>(a)).add(static_cast<int64_t>(t));
  return cached<ConvBwdWeights>(key, [&] {
    ConvBwdWeights r;
    const ConvGeometry g = geometry(p);
    const bool blocked = a != ConvAlgo::direct;
    const auto wa = weights_any(dw.shape(), p.groups, t);
    const auto db = dbias.defined() ? bias_md(dbias, t, x.dtype()) : dnnl::memory::desc();
    const auto xa = activation_md(x, blocked, t), dya = activation_md(dy, blocked, t);
    const auto hint = forward_pd(xa, wa, dbias.defined() ? &db : nullptr, dya, p, alg);
    const auto d = dbias.defined()
                       ? dnnl::convolution_backward_weights::desc(alg, xa, wa, db, dya, g.strides, g.dilates, g.pad_l, g.pad_r)
                       : dnnl::convolution_backward_weights::desc(alg, xa, wa, dya, g.strides, g.dilates, g.pad_l, g.pad_r);
    r.pd = dnnl::convolution_backward_weights::primitive_desc(d, engine(), hint);
    r.prim = dnnl::convolution_backward_weights(r.pd);
    r.x = reordered(md_of(x), r.pd.src_desc(), false);
    r.dy = reordered(md_of(dy), r.pd.diff_dst_desc(), false);
    r.dw = reordered(weights_md(dw, p.groups), r.pd.diff_weights_desc(), true);
    if (dbias.defined()) r.dbias = reordered(bias_md(dbias), r.pd.diff_bias_desc(), true);
    return r;
  });
}

constexpr const char* kOwnDepthwise = "duet:depthwise_nhwc";
constexpr const char* kOwnDirect = "duet:direct_nhwc_avx2";
constexpr const char* kOwnDirectFlipped = "duet:direct_nhwc_avx2 (dy by the flipped weights)";
constexpr const char* kOwnDirectWeights = "duet:direct_nhwc_avx2 (dy^T by x's taps)";
constexpr const char* kOwnWinograd = "duet:winograd_f4x4_3x3_avx2";
constexpr const char* kOwnWinogradFlipped = "duet:winograd_f4x4_3x3_avx2 (dy by the flipped weights)";

}  // namespace

// ---- each pass with a given algorithm ---------------------------------------------------------------

StoreEpilogue store_epilogue(const Tensor& y, const Tensor& residual, std::optional<Activation> act,
                             bool clamps_at_6) {
  StoreEpilogue e;
  // A bf16 output is rounded before the passes add the residual, so only an f32 one adds it inside.
  const bool residual_inside = residual.defined() && residual.dtype() == DType::f32 && y.dtype() == DType::f32 &&
                               same_layout(residual, y);
  if (residual_inside) e.residual = residual.data<float>();
  const bool act_inside = !residual.defined() || residual_inside;
  e.relu = act_inside && (act == Activation::relu || (clamps_at_6 && act == Activation::relu6));
  e.relu6 = e.relu && act == Activation::relu6;
  return e;
}

void finish_store_epilogue(const StoreEpilogue& in_store, const Tensor& y, const Tensor& residual,
                           std::optional<Activation> act) {
  if (residual.defined() && in_store.residual == nullptr) return conv_epilogue_passes(cpu_backend(), y, residual, act);
  if (act && !in_store.relu) conv_epilogue_passes(cpu_backend(), y, Tensor(), act);
}

void run_conv_forward(ConvAlgo a, const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                      const Tensor& y, const Conv2dParams& p) {
  switch (a) {
    case ConvAlgo::matmul: return pointwise_forward(x, w, bias, residual, y, p.act);
    case ConvAlgo::tap_matmul: return tap_forward(x, w, bias, residual, y, p);
    case ConvAlgo::im2col_matmul: return im2col_forward(x, w, bias, residual, y, p);
    case ConvAlgo::own_depthwise:
      profiler::note_impl(kOwnDepthwise);
      return depthwise_forward(x, w, bias, residual, y, p);
    case ConvAlgo::own_direct:
      profiler::note_impl(kOwnDirect);
      return own_direct_forward(x, w, bias, residual, y, p);
    case ConvAlgo::own_winograd:
      own_winograd_forward(x, w, bias, residual, y, p);
      return profiler::note_impl(kOwnWinograd);  // after its matrix products, which name themselves
    case ConvAlgo::flipped_forward:
    case ConvAlgo::col2im_matmul:
      throw Error(fmt::format("conv2d on backend 'cpu': {} runs a gradient, not the forward", algo_name(a)));
    default: break;
  }
  const auto e = forward_entry(a, x, w, bias, residual.defined(), y, p);
  note(e->pd);
  if (e->fused.residual == ResidualBy::sum) cpu_backend().copy(residual, y);  // the sum post-op adds y's old contents
  dnnl::memory ym = output_mem(e->y, y, kDySlot);
  ExecArgs args{{DNNL_ARG_SRC, input_mem(e->x, x, 1)},
                {DNNL_ARG_WEIGHTS, weights_mem(e->w, w, e->kept_weights)},
                {DNNL_ARG_DST, ym}};
  if (bias.defined()) args.add(DNNL_ARG_BIAS, input_mem(e->bias, bias, kConvBiasSlot));
  if (e->fused.residual == ResidualBy::binary)
    args.add(DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, mem(md_of(residual), residual));
  execute(e->prim, args);
  finish_output(e->y, ym, y);
  if (e->epilogue_after) conv_epilogue_passes(cpu_backend(), y, residual, p.act);
}

namespace {
// The weights turned 180 degrees with input and output channels swapped, dense [C, O, KH, KW]:
// w'[c, o, kh, kw] = w[o, c, KH-1-kh, KW-1-kw], read through w's strides (any dense layout).
Tensor flipped_weights(const Tensor& w) {
  const int64_t O = w.size(0), C = w.size(1), KH = w.size(2), KW = w.size(3);
  const Tensor f = Tensor::empty({C, O, KH, KW}, TensorOptions(w.dtype()));
  const size_t es = dtype_size(w.dtype());
  const char* src = static_cast<const char*>(w.raw_data());
  char* dst = static_cast<char*>(f.raw_data());
  const int64_t s0 = w.stride(0), s1 = w.stride(1), s2 = w.stride(2), s3 = w.stride(3);
  parallel_for(C, C * O * KH * KW, [&](int64_t b, int64_t e) {
    for (int64_t c = b; c < e; ++c)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw)
            std::memcpy(dst + static_cast<size_t>(((c * O + o) * KH + kh) * KW + kw) * es,
                        src + static_cast<size_t>(o * s0 + c * s1 + (KH - 1 - kh) * s2 + (KW - 1 - kw) * s3) * es, es);
  });
  return f;
}
}  // namespace

void run_conv_backward_data(ConvAlgo a, const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p,
                            const std::optional<dnnl::memory>& dy_ready) {
  switch (a) {
    case ConvAlgo::matmul: return pointwise_backward_data(dy, w, dx);
    case ConvAlgo::col2im_matmul: return col2im_backward_data(dy, w, dx, p);
    case ConvAlgo::flipped_forward: {
      // dx = conv(dy, w'), stride 1, padded by dilation * (K - 1) - padding on each side: the same
      // sums as the data gradient's, on oneDNN's forward kernels (planner.h).
      return run_conv_forward(ConvAlgo::direct, dy, flipped_weights(w), Tensor(), Tensor(), dx,
                              flipped_forward_params(p, w));
    }
    case ConvAlgo::tap_matmul: return tap_backward_data(dy, w, dx, p);
    case ConvAlgo::own_depthwise:
      profiler::note_impl(kOwnDepthwise);
      return depthwise_backward_data(dy, w, dx, p);
    case ConvAlgo::im2col_matmul:
      throw Error("conv2d_backward on backend 'cpu': im2col runs forwards and weight gradients only");
    case ConvAlgo::own_direct:
      profiler::note_impl(kOwnDirectFlipped);
      return own_direct_backward_data(dy, w, dx, p);
    case ConvAlgo::own_winograd:
      own_winograd_backward_data(dy, w, dx, p);
      return profiler::note_impl(kOwnWinogradFlipped);
    default: break;
  }
  const auto e = data_entry(a, dy, w, dx, p);
  note(e->pd);
  dnnl::memory dxm = output_mem(e->dx, dx, 1);
  execute(e->prim, {{DNNL_ARG_DIFF_DST, dy_ready ? *dy_ready : input_mem(e->dy, dy, kDySlot)},
                    {DNNL_ARG_WEIGHTS, weights_mem(e->w, w, e->kept_weights)},
                    {DNNL_ARG_DIFF_SRC, dxm}});
  finish_output(e->dx, dxm, dx);
}

void run_conv_backward_weight(ConvAlgo a, const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                              const Conv2dParams& p, const std::optional<dnnl::memory>& dy_ready) {
  switch (a) {
    case ConvAlgo::matmul: return pointwise_backward_weight(x, dy, dw);
    case ConvAlgo::im2col_matmul: return im2col_backward_weight(x, dy, dw, p);
    case ConvAlgo::tap_matmul: return tap_backward_weight(x, dy, dw, dbias, p);
    case ConvAlgo::own_depthwise:
      profiler::note_impl(kOwnDepthwise);
      return depthwise_backward_weight(x, dy, dw, dbias, p);
    case ConvAlgo::flipped_forward:
    case ConvAlgo::col2im_matmul:
      throw Error(fmt::format("conv2d_backward on backend 'cpu': {} runs a data gradient", algo_name(a)));
    case ConvAlgo::own_direct:
      if (dbias.defined()) throw Error("conv2d_backward on backend 'cpu': duet direct sums no bias gradient");
      profiler::note_impl(kOwnDirectWeights);
      return own_direct_backward_weight(x, dy, dw, p);
    case ConvAlgo::own_winograd:
      if (dbias.defined()) throw Error("conv2d_backward on backend 'cpu': duet winograd sums no bias gradient");
      own_winograd_backward_weight(x, dy, dw, p);
      return profiler::note_impl(kOwnWinograd);
    default: break;
  }
  const auto e = weight_entry(a, x, dy, dw, dbias, p);
  if (profiler::enabled())
    profiler::note_impl(std::string(e->pd.impl_info_str()) + (dy_ready ? " (dy as reordered for backward_data)" : ""));
  dnnl::memory dwm = output_mem(e->dw, dw, 0);
  ExecArgs args{{DNNL_ARG_SRC, input_mem(e->x, x, 1)},
                {DNNL_ARG_DIFF_DST, dy_ready ? *dy_ready : input_mem(e->dy, dy, kDySlot)},
                {DNNL_ARG_DIFF_WEIGHTS, dwm}};
  dnnl::memory dbm = dbias.defined() ? output_mem(e->dbias, dbias, kConvBiasSlot) : dnnl::memory();
  if (dbias.defined()) args.add(DNNL_ARG_DIFF_BIAS, dbm);
  execute(e->prim, args);
  finish_output(e->dw, dwm, dw);
  if (dbias.defined()) finish_output(e->dbias, dbm, dbias);
}

std::optional<dnnl::memory> shared_dy(ConvAlgo data, ConvAlgo weight, const Tensor& dy, const Tensor& x,
                                      const Tensor& w, const Tensor& dx, const Tensor& dw, const Tensor& dbias,
                                      const Conv2dParams& p) {
  if (!uses_onednn(data) || !uses_onednn(weight)) return std::nullopt;
  const auto d = data_entry(data, dy, w, dx, p);
  const auto g = weight_entry(weight, x, dy, dw, dbias, p);
  if (!d->dy.needed || !g->dy.needed || d->dy.prim != g->dy.prim) return std::nullopt;
  return input_mem(d->dy, dy, kDySlot);
}

std::string onednn_conv_impl(ConvAlgo a, ConvPass pass, const Tensor& x, const Tensor& w, const Tensor& y,
                             const Conv2dParams& p, bool bias) {
  // Only shapes and layouts matter to a primitive descriptor: undefined stand-ins for tensors the
  // query does not have would change the key, so a bias (gradient) is described by x's dtype.
  try {
    switch (pass) {
      case ConvPass::forward: {
        const Tensor b = bias ? Tensor::empty({w.size(0)}, TensorOptions(x.dtype())) : Tensor();
        return forward_entry(a, x, w, b, false, y, p)->pd.impl_info_str();
      }
      case ConvPass::backward_data: return data_entry(a, y, w, x, p)->pd.impl_info_str();
      case ConvPass::backward_weight: {
        const Tensor b = bias ? Tensor::empty({w.size(0)}, TensorOptions(x.dtype())) : Tensor();
        return weight_entry(a, x, y, w, b, p)->pd.impl_info_str();
      }
    }
  } catch (const dnnl::error&) {
  }
  return "";
}

}  // namespace cpu

using namespace cpu;

// ---- the entry points ---------------------------------------------------------------------------------

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                        const Conv2dParams& p) {
  if (y.numel() == 0) return;
  guarded("conv2d", {&x, &w, &bias, &residual}, [&] {
    const ConvPlan& plan = plan_conv({ConvPass::forward, x, w, y, p, bias.defined()},
                                    [&](ConvAlgo a) { run_conv_forward(a, x, w, bias, residual, y, p); });
    run_conv_forward(plan.algo, x, w, bias, residual, y, p);
    profiler::note_reason(plan.reason);
  });
}

// Both gradients in one call (ops.def's output mask): each wanted pass planned, dy reordered once
// where both passes' primitives want it in the same layout, and each pass profiled in a window of
// its own (engine/conv_backward.h).
void CpuBackend::conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                 const Tensor& dw, const Tensor& db, const Conv2dParams& p) {
  const bool data = dx.defined() && dx.numel() > 0;
  bool weight = dw.defined() && dw.numel() > 0;
  if (dy.numel() == 0 || (weight && x.numel() == 0)) {  // an empty sum: the gradient is zero
    if (weight) fill(dw, 0.0);
    if (weight && db.defined()) fill(db, 0.0);
    weight = false;
    if (data && dy.numel() == 0) return fill(dx, 0.0);
  }
  if (!data && !weight) return;
  guarded("conv2d_backward", {&dy, &x, &w}, [&] {
    const ConvPlan* data_plan = data ? &plan_conv({ConvPass::backward_data, dx, w, dy, p, false},
                                                 [&](ConvAlgo a) { run_conv_backward_data(a, dy, w, dx, p); })
                                     : nullptr;
    const ConvPlan* weight_plan =
        weight ? &plan_conv({ConvPass::backward_weight, x, dw, dy, p, db.defined()},
                            [&](ConvAlgo a) { run_conv_backward_weight(a, x, dy, dw, db, p); })
               : nullptr;
    const std::optional<dnnl::memory> dy_ready =
        data && weight ? shared_dy(data_plan->algo, weight_plan->algo, dy, x, w, dx, dw, db, p) : std::nullopt;
    if (data) {
      const profiler::OpScope window = data_gradient_window(Backend::cpu, dy, w, dx);
      run_conv_backward_data(data_plan->algo, dy, w, dx, p, dy_ready);
      profiler::note_reason(data_plan->reason);
    }
    if (weight) {
      const profiler::OpScope window = weight_gradient_window(Backend::cpu, x, dy, dw, db);
      run_conv_backward_weight(weight_plan->algo, x, dy, dw, db, p, dy_ready);
      profiler::note_reason(weight_plan->reason);
    }
  });
}

}  // namespace duet
