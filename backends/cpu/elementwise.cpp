// Elementwise ops on the cpu backend. Transcendental f32 maths (exp, log, tanh and the smooth
// activations with their derivatives) runs in oneDNN's jit eltwise kernels, which vectorise
// exp/erf/tanh with AVX-512, except GELU (erf), whose forward and backward are our own SIMD
// loops over vmath.h (oneDNN 2.6's gelu_erf backward took twice PyTorch's time); cheap ops
// (neg, abs, relu, scalar arithmetic, broadcasting binary ops, dropout) are OpenMP loops the
// compiler vectorises, since they are memory-bound and a primitive call would cost more than
// the arithmetic on small tensors. f64 takes the loops. bf16 (a mixed-precision network's
// activations) runs the same f32 code on chunks widened into a buffer and rounded back, so it moves
// bf16's bytes and computes in f32; f16 goes to the reference loops, named in the profile.
#include <array>
#include <cmath>
#include "backends/cpu/loops.h"
#include "engine/half.h"
#include "backends/cpu/vmath.h"
#include "engine/scalar_math.h"
#include "engine/rng.h"

namespace duet {
using namespace cpu;

namespace {

// o[i] = f(in[i]) over [b, e), in SIMD clones: memory-bound loops still gain from full-width
// loads and stores (relu, scalar ops).
template <class T, class F>
DUET_SIMD_CLONES void map_chunk(const T* in, T* o, int64_t b, int64_t e, F f) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) o[i] = f(in[i]);
}

// x dense and out with the same strides: one flat span (see the contract in ops.def).
template <class T, class F>
void map_flat(const Tensor& x, const Tensor& out, F f) {
  const T* in = static_cast<const T*>(x.raw_data());
  T* o = static_cast<T*>(out.raw_data());
  parallel_for(x.numel(), x.numel(), [&](int64_t b, int64_t e) { map_chunk(in, o, b, e, f); });
}

// ---- oneDNN eltwise on a flat span ----------------------------------------------------------------

struct EltwiseFwd {
  dnnl::eltwise_forward::primitive_desc pd;
  dnnl::eltwise_forward prim;
};
struct EltwiseBwd {
  dnnl::eltwise_backward::primitive_desc pd;
  dnnl::eltwise_backward prim;
};

dnnl::eltwise_forward::primitive_desc eltwise_fwd_pd(dnnl::algorithm alg, int64_t n, float alpha, float beta) {
  const auto md = md_flat(n);
  return dnnl::eltwise_forward::primitive_desc(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, alg, md, alpha, beta), engine());
}

void eltwise_forward(const char* op, dnnl::algorithm alg, float alpha, float beta, const Tensor& x, const Tensor& out) {
  const int64_t n = x.numel();
  if (n == 0) return;
  guarded(op, {&x}, [&] {
    Key key("eltwise_fwd");
    key.add(int64_t(alg)).add(n).add(double(alpha)).add(double(beta));
    auto e = cached<EltwiseFwd>(key, [&] {
      EltwiseFwd r;
      r.pd = eltwise_fwd_pd(alg, n, alpha, beta);
      r.prim = dnnl::eltwise_forward(r.pd);
      return r;
    });
    note(e->pd);
    const auto md = md_flat(n);
    execute(e->prim, {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DST, mem(md, out)}});
  });
}

void eltwise_backward(const char* op, dnnl::algorithm alg, float alpha, float beta, const Tensor& x, const Tensor& dy,
                      const Tensor& dx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  guarded(op, {&x, &dy}, [&] {
    Key key("eltwise_bwd");
    key.add(int64_t(alg)).add(n).add(double(alpha)).add(double(beta));
    auto e = cached<EltwiseBwd>(key, [&] {
      EltwiseBwd r;
      const auto md = md_flat(n);
      r.pd = dnnl::eltwise_backward::primitive_desc(dnnl::eltwise_backward::desc(alg, md, md, alpha, beta), engine(),
                                                    eltwise_fwd_pd(alg, n, alpha, beta));
      r.prim = dnnl::eltwise_backward(r.pd);
      return r;
    });
    note(e->pd);
    const auto md = md_flat(n);
    execute(e->prim, {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DIFF_DST, mem(md, dy)}, {DNNL_ARG_DIFF_SRC, mem(md, dx)}});
  });
}

// ---- unary / scalar ---------------------------------------------------------------------------------

template <class T>
void unary_loop(UnaryOp op, const Tensor& x, const Tensor& out) {
  switch (op) {
    case UnaryOp::neg: return map_flat<T>(x, out, [](T v) { return -v; });
    case UnaryOp::exp: return map_flat<T>(x, out, [](T v) { return std::exp(v); });
    case UnaryOp::log: return map_flat<T>(x, out, [](T v) { return std::log(v); });
    case UnaryOp::sqrt: return map_flat<T>(x, out, [](T v) { return std::sqrt(v); });
    case UnaryOp::rsqrt: return map_flat<T>(x, out, [](T v) { return T(1) / std::sqrt(v); });
    case UnaryOp::abs: return map_flat<T>(x, out, [](T v) { return std::abs(v); });
    case UnaryOp::tanh: return map_flat<T>(x, out, [](T v) { return std::tanh(v); });
    case UnaryOp::square: return map_flat<T>(x, out, [](T v) { return v * v; });
    case UnaryOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("unary on backend 'cpu': unknown op code {}", static_cast<int>(op)));
}

// Calls f with the formula of op for values of type T (one lambda per op, picked once per tensor).
template <class T, class F>
void with_scalar_formula(ScalarOp op, T s, F&& f) {
  switch (op) {
    case ScalarOp::add: return f([s](T v) { return v + s; });
    case ScalarOp::mul: return f([s](T v) { return v * s; });
    case ScalarOp::pow:
      if (s == T(2)) return f([](T v) { return v * v; });
      if (s == T(1)) return f([](T v) { return v; });
      return f([s](T v) { return std::pow(v, s); });
    case ScalarOp::rsub: return f([s](T v) { return s - v; });
    case ScalarOp::rdiv: return f([s](T v) { return s / v; });
    case ScalarOp::maximum: return f([s](T v) { return max_nan(v, s); });
    case ScalarOp::minimum: return f([s](T v) { return min_nan(v, s); });
    case ScalarOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("scalar_op on backend 'cpu': unknown op code {}", static_cast<int>(op)));
}

template <class T>
void scalar_loop(ScalarOp op, const Tensor& x, T s, const Tensor& out) {
  with_scalar_formula<T>(op, s, [&](auto fn) { map_flat<T>(x, out, fn); });
}

// ---- binary with broadcasting ------------------------------------------------------------------------

// S is the storage type (float, double or BFloat16); the formula f runs on widen(S): a bf16 operand
// is widened on load and rounded to nearest even on store, element by element, which the compiler
// vectorises like the f32 loop (bf16 gradient sums arrive as strided channel slices of cat).
template <class S, class F>
void zip(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const Walk<3> w = simplify<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()});
  S* po = ptr<S>(out);
  const S* pa = ptr<S>(a);
  const S* pb = ptr<S>(b);
  for_each_row<3>(w, [&](const std::array<int64_t, 3>& off, int64_t len, const std::array<int64_t, 3>& is) {
    S* o = po + off[0];
    const S* x = pa + off[1];
    const S* y = pb + off[2];
    // The shapes that dominate real use get their own unit-stride loops: same layout, and a
    // per-row scalar (bias, per-channel scale) on either side.
    if (is[0] == 1 && is[1] == 1 && is[2] == 1) {
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) o[i] = narrow<S>(f(widen(x[i]), widen(y[i])));
    } else if (is[0] == 1 && is[1] == 1 && is[2] == 0) {
      const auto v = widen(y[0]);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) o[i] = narrow<S>(f(widen(x[i]), v));
    } else if (is[0] == 1 && is[1] == 0 && is[2] == 1) {
      const auto u = widen(x[0]);
#pragma omp simd
      for (int64_t i = 0; i < len; ++i) o[i] = narrow<S>(f(u, widen(y[i])));
    } else {
      for (int64_t i = 0; i < len; ++i) o[i * is[0]] = narrow<S>(f(widen(x[i * is[1]]), widen(y[i * is[2]])));
    }
  });
}

template <class T, class F>
void with_binary_formula(BinaryOp op, F&& f) {
  switch (op) {
    case BinaryOp::add: return f([](T u, T v) { return u + v; });
    case BinaryOp::sub: return f([](T u, T v) { return u - v; });
    case BinaryOp::mul: return f([](T u, T v) { return u * v; });
    case BinaryOp::div: return f([](T u, T v) { return u / v; });
    case BinaryOp::maximum: return f([](T u, T v) { return max_nan(u, v); });
    case BinaryOp::minimum: return f([](T u, T v) { return min_nan(u, v); });
    case BinaryOp::eq: return f([](T u, T v) { return u == v ? T(1) : T(0); });
    case BinaryOp::gt: return f([](T u, T v) { return u > v ? T(1) : T(0); });
    case BinaryOp::lt: return f([](T u, T v) { return u < v ? T(1) : T(0); });
    case BinaryOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("binary on backend 'cpu': unknown op code {}", static_cast<int>(op)));
}

template <class T>
void binary_loop(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  with_binary_formula<T>(op, [&](auto fn) { zip<T>(a, b, out, fn); });
}

// ---- activations ---------------------------------------------------------------------------------------

// The formulas are engine/scalar_math.h's (ActivationFn), shared with the reference and CUDA
// backends; with_activation picks one per tensor, so each loop is a plain SIMD loop over one formula.
template <class T>
void activation_loop(Activation act, T alpha, const Tensor& x, const Tensor& out) {
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    map_flat<T>(x, out, [alpha](T v) { return Fn::value(v, alpha); });
  });
}

template <class T, class F>
DUET_SIMD_CLONES void backward_chunk(const T* px, const T* pdy, T* pdx, int64_t b, int64_t e, F dfdx) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) pdx[i] = pdy[i] * dfdx(px[i]);
}

template <class T>
void activation_backward_loop(Activation act, T alpha, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const T* px = static_cast<const T*>(x.raw_data());
  const T* pdy = static_cast<const T*>(dy.raw_data());
  T* pdx = static_cast<T*>(dx.raw_data());
  if (act == Activation::relu) {
    // A select, not dy * (x > 0): GCC turns the multiply-by-mask into a branch it may not
    // if-convert (the multiply "could trap"), which ran 13x slower. Same values for finite dy;
    // for x <= 0 an infinite dy gives 0 (PyTorch's threshold_backward) instead of NaN.
    parallel_for(x.numel(), x.numel(), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const T xv = px[i], g = pdy[i];
        pdx[i] = xv > T(0) ? g : T(0);
      }
    });
    return;
  }
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    parallel_for(x.numel(), x.numel(), [&](int64_t b, int64_t e) {
      backward_chunk(px, pdy, pdx, b, e, [alpha](T v) { return Fn::derivative(v, alpha); });
    });
  });
}

// ---- GELU (erf) in f32: y = x Phi(x), dy/dx = Phi(x) + x phi(x) -----------------------------------

DUET_SIMD_CLONES void gelu_erf_chunk(const float* __restrict x, float* __restrict y, int64_t b, int64_t e) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) y[i] = x[i] * vmath::normal_cdf(x[i]).cdf;
}

DUET_SIMD_CLONES void gelu_erf_backward_chunk(const float* __restrict x, const float* __restrict dy,
                                              float* __restrict dx, int64_t b, int64_t e) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    const float v = x[i];
    const vmath::CdfGauss c = vmath::normal_cdf(v);
    dx[i] = dy[i] * (c.cdf + v * (kInvSqrt2Pi<float> * c.gauss));
  }
}

// ~40 vector instructions per element: worth a thread well below the memory-bound grain.
constexpr int64_t kGeluCost = 8;

void gelu_erf_f32(const Tensor& x, const Tensor& out) {
  const float* px = static_cast<const float*>(x.raw_data());
  float* po = static_cast<float*>(out.raw_data());
  parallel_for(x.numel(), x.numel() * kGeluCost, [&](int64_t b, int64_t e) { gelu_erf_chunk(px, po, b, e); });
}

void gelu_erf_backward_f32(const Tensor& x, const Tensor& dy, const Tensor& dx) {
  const float* px = static_cast<const float*>(x.raw_data());
  const float* pdy = static_cast<const float*>(dy.raw_data());
  float* pdx = static_cast<float*>(dx.raw_data());
  parallel_for(x.numel(), x.numel() * kGeluCost,
               [&](int64_t b, int64_t e) { gelu_erf_backward_chunk(px, pdy, pdx, b, e); });
}

// ---- bf16 through the f32 loops ---------------------------------------------------------------------
// Each thread widens a chunk of its span of every input into a buffer on its stack (bf16 to f32 is
// exact), runs the f32 code on the buffers and rounds the result back to nearest even (engine/half.h,
// the rounding of every backend). The memory traffic is bf16's; the maths is the f32 loops'.
constexpr int64_t kBf16Chunk = 1024;

DUET_SIMD_CLONES void widen_bf16(const uint16_t* __restrict s, float* __restrict d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_float(s[i]);
}

DUET_SIMD_CLONES void narrow_bf16(const float* __restrict s, uint16_t* __restrict d, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) d[i] = float_to_bf16(s[i]);
}

// f(ins, out, n) on the f32 buffers, over the flat span of K dense bf16 inputs laid out like `out`.
template <size_t K, class F>
void bf16_chunks(const std::array<const Tensor*, K>& in, const Tensor& out, int64_t cost, F f) {
  const int64_t n = out.numel();
  auto* po = static_cast<uint16_t*>(out.raw_data());
  parallel_for(n, n * cost, [&](int64_t b, int64_t e) {
    alignas(64) float buf[K + 1][kBf16Chunk];
    for (int64_t c = b; c < e; c += kBf16Chunk) {
      const int64_t len = std::min(kBf16Chunk, e - c);
      std::array<const float*, K> ins;
      for (size_t k = 0; k < K; ++k) {
        widen_bf16(static_cast<const uint16_t*>(in[k]->raw_data()) + c, buf[k], len);
        ins[k] = buf[k];
      }
      f(ins, buf[K], len);
      narrow_bf16(buf[K], po + c, len);
    }
  });
}

void activation_bf16(Activation act, float alpha, const Tensor& x, const Tensor& out) {
  if (act == Activation::gelu_erf)
    return bf16_chunks<1>({&x}, out, kGeluCost, [](const auto& in, float* o, int64_t n) { gelu_erf_chunk(in[0], o, 0, n); });
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    bf16_chunks<1>({&x}, out, 1, [alpha](const auto& in, float* o, int64_t n) {
      map_chunk(in[0], o, 0, n, [alpha](float v) { return Fn::value(v, alpha); });
    });
  });
}

void activation_backward_bf16(Activation act, float alpha, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  if (act == Activation::gelu_erf)
    return bf16_chunks<2>({&x, &dy}, dx, kGeluCost,
                          [](const auto& in, float* o, int64_t n) { gelu_erf_backward_chunk(in[0], in[1], o, 0, n); });
  if (act == Activation::relu)  // a select, as in the f32 loop
    return bf16_chunks<2>({&x, &dy}, dx, 1, [](const auto& in, float* o, int64_t n) {
      for (int64_t i = 0; i < n; ++i) o[i] = in[0][i] > 0.f ? in[1][i] : 0.f;
    });
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    bf16_chunks<2>({&x, &dy}, dx, 1, [alpha](const auto& in, float* o, int64_t n) {
      backward_chunk(in[0], in[1], o, 0, n, [alpha](float v) { return Fn::derivative(v, alpha); });
    });
  });
}

// oneDNN's algorithm for each activation. relu and relu6 stay loops: a compare or two per
// element is memory-bound anyway, and oneDNN's clip (relu6) maps NaN to 0 where PyTorch keeps
// it; gelu_erf has its own (gelu_erf_f32).
bool dnnl_activation(Activation act, dnnl::algorithm& alg, float& alpha, float& beta) {
  alpha = 0.f, beta = 0.f;
  switch (act) {
    case Activation::relu: return false;
    case Activation::relu6: return false;  // a loop: oneDNN's clip turns NaN into 0
    case Activation::gelu_erf: return false;  // gelu_erf_f32
    case Activation::gelu_tanh: alg = dnnl::algorithm::eltwise_gelu_tanh; return true;
    case Activation::sigmoid: alg = dnnl::algorithm::eltwise_logistic; return true;
    case Activation::silu: alg = dnnl::algorithm::eltwise_swish; alpha = 1.f; return true;
    case Activation::hardswish: alg = dnnl::algorithm::eltwise_hardswish; return true;
    default: return false;  // an activation without a oneDNN algorithm runs the shared formula's loop
  }
}

}  // namespace

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  if (x.dtype() == DType::bf16) {  // the front-end sends only neg (the rest is computed in f32)
    if (op != UnaryOp::neg) return reference_fallback("bf16 unary maths has no cpu kernel").unary(op, x, out);
    return bf16_chunks<1>({&x}, out, 1, [](const auto& in, float* o, int64_t n) {
      map_chunk(in[0], o, 0, n, [](float v) { return -v; });
    });
  }
  if (x.dtype() == DType::f32 && (op == UnaryOp::exp || op == UnaryOp::log || op == UnaryOp::tanh)) {
    const auto alg = op == UnaryOp::exp   ? dnnl::algorithm::eltwise_exp
                     : op == UnaryOp::log ? dnnl::algorithm::eltwise_log
                                          : dnnl::algorithm::eltwise_tanh;
    return eltwise_forward(unary_name(op), alg, 0.f, 0.f, x, out);
  }
  dispatch_float(x.dtype(), unary_name(op), [&](auto tag) { unary_loop<decltype(tag)>(op, x, out); });
}

void CpuBackend::scalar_op(ScalarOp op, const Tensor& x, double s, const Tensor& out) {
  if (x.dtype() == DType::bf16) {
    // Each chunk runs the f32 loop on a buffer view; the span pointers are the chunk's.
    return with_scalar_formula<float>(op, static_cast<float>(s), [&](auto fn) {
      bf16_chunks<1>({&x}, out, 1, [fn](const auto& in, float* o, int64_t n) { map_chunk(in[0], o, 0, n, fn); });
    });
  }
  dispatch_float(x.dtype(), scalar_op_name(op), [&](auto tag) {
    using T = decltype(tag);
    scalar_loop<T>(op, x, static_cast<T>(s), out);
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  if (out.dtype() == DType::bf16)  // f32 maths on bf16 bytes, any strides and broadcasting
    return with_binary_formula<float>(op, [&](auto fn) { zip<BFloat16>(a, b, out, fn); });
  dispatch_float(out.dtype(), binary_name(op), [&](auto tag) { binary_loop<decltype(tag)>(op, a, b, out); });
}

void CpuBackend::activation(Activation act, double act_alpha, const Tensor& x, const Tensor& out) {
  if (x.dtype() == DType::bf16) return activation_bf16(act, static_cast<float>(act_alpha), x, out);
  if (x.dtype() == DType::f32 && act == Activation::gelu_erf) return gelu_erf_f32(x, out);
  dnnl::algorithm alg;
  float alpha, beta;
  if (x.dtype() == DType::f32 && dnnl_activation(act, alg, alpha, beta))
    return eltwise_forward(activation_name(act), alg, alpha, beta, x, out);
  dispatch_float(x.dtype(), activation_name(act),
                 [&](auto tag) { activation_loop<decltype(tag)>(act, decltype(tag)(act_alpha), x, out); });
}

void CpuBackend::activation_backward(Activation act, double act_alpha, const Tensor& x, const Tensor& dy,
                                     const Tensor& dx) {
  if (x.dtype() == DType::bf16) return activation_backward_bf16(act, static_cast<float>(act_alpha), x, dy, dx);
  if (x.dtype() == DType::f32 && act == Activation::gelu_erf) return gelu_erf_backward_f32(x, dy, dx);
  dnnl::algorithm alg;
  float alpha, beta;
  if (x.dtype() == DType::f32 && dnnl_activation(act, alg, alpha, beta))
    return eltwise_backward("activation_backward", alg, alpha, beta, x, dy, dx);
  dispatch_float(x.dtype(), "activation_backward",
                 [&](auto tag) { activation_backward_loop<decltype(tag)>(act, decltype(tag)(act_alpha), x, dy, dx); });
}

// Element i of the flat span is kept iff uniform01(seed, offset + i) >= p: the reference's rule,
// so masks agree bit for bit across backends and thread counts.
void CpuBackend::dropout(const Tensor& x, const Tensor& y, const Tensor& mask, double p, uint64_t seed,
                         uint64_t offset) {
  // f32, f64, or bf16 bytes with f32 maths: the reference's formula, element for element.
  const auto run = [&](auto tag) {
    using S = decltype(tag);
    using W = decltype(widen(S{}));
    const S* px = ptr<S>(x);
    S* py = ptr<S>(y);
    S* pm = ptr<S>(mask);
    const W scale = p < 1.0 ? static_cast<W>(1.0 / (1.0 - p)) : W(0);
    parallel_for(x.numel(), x.numel() * 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const bool keep = uniform01(seed, offset + static_cast<uint64_t>(i)) >= p;
        pm[i] = narrow<S>(keep ? scale : W(0));
        py[i] = narrow<S>(widen(px[i]) * widen(pm[i]));
      }
    });
  };
  if (x.dtype() == DType::bf16) return run(BFloat16{});
  dispatch_float(x.dtype(), "dropout", run);
}

}  // namespace duet
