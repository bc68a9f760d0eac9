// Elementwise ops on the cpu backend. Transcendental f32 maths (exp, log, tanh and the smooth
// activations with their derivatives) runs in oneDNN's jit eltwise kernels, which vectorise
// exp/erf/tanh with AVX-512, except GELU (erf), whose forward and backward are our own SIMD
// loops over vmath.h (oneDNN 2.6's gelu_erf backward took twice PyTorch's time); cheap ops
// (neg, abs, relu, scalar arithmetic, broadcasting binary ops, dropout) are OpenMP loops the
// compiler vectorises, since they are memory-bound and a primitive call would cost more than
// the arithmetic on small tensors. f64 takes the loops.
#include <cmath>
#include "backends/cpu/loops.h"
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
    e->prim.execute(stream(), {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DST, mem(md, out)}});
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
    e->prim.execute(stream(),
                    {{DNNL_ARG_SRC, mem(md, x)}, {DNNL_ARG_DIFF_DST, mem(md, dy)}, {DNNL_ARG_DIFF_SRC, mem(md, dx)}});
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

template <class T>
void scalar_loop(ScalarOp op, const Tensor& x, T s, const Tensor& out) {
  switch (op) {
    case ScalarOp::add: return map_flat<T>(x, out, [s](T v) { return v + s; });
    case ScalarOp::mul: return map_flat<T>(x, out, [s](T v) { return v * s; });
    case ScalarOp::pow:
      if (s == T(2)) return map_flat<T>(x, out, [](T v) { return v * v; });
      if (s == T(1)) return map_flat<T>(x, out, [](T v) { return v; });
      return map_flat<T>(x, out, [s](T v) { return std::pow(v, s); });
    case ScalarOp::rsub: return map_flat<T>(x, out, [s](T v) { return s - v; });
    case ScalarOp::rdiv: return map_flat<T>(x, out, [s](T v) { return s / v; });
    case ScalarOp::maximum: return map_flat<T>(x, out, [s](T v) { return max_nan(v, s); });
    case ScalarOp::minimum: return map_flat<T>(x, out, [s](T v) { return min_nan(v, s); });
    case ScalarOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("scalar_op on backend 'cpu': unknown op code {}", static_cast<int>(op)));
}

// ---- binary with broadcasting ------------------------------------------------------------------------

template <class T, class F>
void zip(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const Walk<3> w = simplify<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()});
  T* po = static_cast<T*>(out.raw_data());
  const T* pa = static_cast<const T*>(a.raw_data());
  const T* pb = static_cast<const T*>(b.raw_data());
  for_each_row<3>(w, [&](const std::array<int64_t, 3>& off, int64_t len, const std::array<int64_t, 3>& is) {
    T* o = po + off[0];
    const T* x = pa + off[1];
    const T* y = pb + off[2];
    // The shapes that dominate real use get their own unit-stride loops: same layout, and a
    // per-row scalar (bias, per-channel scale) on either side.
    if (is[0] == 1 && is[1] == 1 && is[2] == 1) {
      for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], y[i]);
    } else if (is[0] == 1 && is[1] == 1 && is[2] == 0) {
      const T v = y[0];
      for (int64_t i = 0; i < len; ++i) o[i] = f(x[i], v);
    } else if (is[0] == 1 && is[1] == 0 && is[2] == 1) {
      const T u = x[0];
      for (int64_t i = 0; i < len; ++i) o[i] = f(u, y[i]);
    } else {
      for (int64_t i = 0; i < len; ++i) o[i * is[0]] = f(x[i * is[1]], y[i * is[2]]);
    }
  });
}

template <class T>
void binary_loop(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
    case BinaryOp::add: return zip<T>(a, b, out, [](T u, T v) { return u + v; });
    case BinaryOp::sub: return zip<T>(a, b, out, [](T u, T v) { return u - v; });
    case BinaryOp::mul: return zip<T>(a, b, out, [](T u, T v) { return u * v; });
    case BinaryOp::div: return zip<T>(a, b, out, [](T u, T v) { return u / v; });
    case BinaryOp::maximum: return zip<T>(a, b, out, [](T u, T v) { return max_nan(u, v); });
    case BinaryOp::minimum: return zip<T>(a, b, out, [](T u, T v) { return min_nan(u, v); });
    case BinaryOp::eq: return zip<T>(a, b, out, [](T u, T v) { return u == v ? T(1) : T(0); });
    case BinaryOp::gt: return zip<T>(a, b, out, [](T u, T v) { return u > v ? T(1) : T(0); });
    case BinaryOp::lt: return zip<T>(a, b, out, [](T u, T v) { return u < v ? T(1) : T(0); });
    case BinaryOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("binary on backend 'cpu': unknown op code {}", static_cast<int>(op)));
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
  if (x.dtype() == DType::f32 && (op == UnaryOp::exp || op == UnaryOp::log || op == UnaryOp::tanh)) {
    const auto alg = op == UnaryOp::exp   ? dnnl::algorithm::eltwise_exp
                     : op == UnaryOp::log ? dnnl::algorithm::eltwise_log
                                          : dnnl::algorithm::eltwise_tanh;
    return eltwise_forward(unary_name(op), alg, 0.f, 0.f, x, out);
  }
  dispatch_float(x.dtype(), unary_name(op), [&](auto tag) { unary_loop<decltype(tag)>(op, x, out); });
}

void CpuBackend::scalar_op(ScalarOp op, const Tensor& x, double s, const Tensor& out) {
  dispatch_float(x.dtype(), scalar_op_name(op), [&](auto tag) {
    using T = decltype(tag);
    scalar_loop<T>(op, x, static_cast<T>(s), out);
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(out.dtype(), binary_name(op), [&](auto tag) { binary_loop<decltype(tag)>(op, a, b, out); });
}

void CpuBackend::activation(Activation act, double act_alpha, const Tensor& x, const Tensor& out) {
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
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = static_cast<const T*>(x.raw_data());
    T* py = static_cast<T*>(y.raw_data());
    T* pm = static_cast<T*>(mask.raw_data());
    const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    parallel_for(x.numel(), x.numel() * 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const bool keep = uniform01(seed, offset + static_cast<uint64_t>(i)) >= p;
        pm[i] = keep ? scale : T(0);
        py[i] = px[i] * pm[i];
      }
    });
  });
}

}  // namespace duet
