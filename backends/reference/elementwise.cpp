// Elementwise ops on the host: unary maths, tensor-scalar ops, broadcasting binary ops, the
// activations with their derivatives, and dropout. Dense operands are walked as one flat span, a
// loop the compiler may vectorise; binary ops walk out's index space through each operand's strides.
#include <algorithm>
#include <cmath>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"
#include "engine/rng.h"

namespace duet {
using namespace ref;

namespace {

// A dense tensor with positive strides covers exactly numel consecutive elements starting at
// element [0, ..., 0], and operands with equal strides line up element for element in that span,
// so an elementwise op is one loop over memory whatever the dimension order.
// T is the storage type; f computes in its wide type W (float for f16 and bf16, which are rounded
// once when stored, as every backend does).
template <class T>
using wide_t = decltype(widen(T{}));

template <class T, class F>
void map_flat(const Tensor& x, const Tensor& out, F f) {
  const T* in = ptr<T>(x);
  T* o = ptr<T>(out);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = narrow<T>(f(widen(in[i])));
}

// Each switch picks a lambda once, outside the element loop.
template <class T>
void unary_kernel(UnaryOp op, const Tensor& x, const Tensor& out) {
  using W = wide_t<T>;
  switch (op) {
    case UnaryOp::neg: return map_flat<T>(x, out, [](W v) { return -v; });
    case UnaryOp::exp: return map_flat<T>(x, out, [](W v) { return std::exp(v); });
    case UnaryOp::log: return map_flat<T>(x, out, [](W v) { return std::log(v); });
    case UnaryOp::sqrt: return map_flat<T>(x, out, [](W v) { return std::sqrt(v); });
    case UnaryOp::rsqrt: return map_flat<T>(x, out, [](W v) { return W(1) / std::sqrt(v); });
    case UnaryOp::abs: return map_flat<T>(x, out, [](W v) { return std::abs(v); });
    case UnaryOp::tanh: return map_flat<T>(x, out, [](W v) { return std::tanh(v); });
    case UnaryOp::square: return map_flat<T>(x, out, [](W v) { return v * v; });
    case UnaryOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("unary on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

template <class T>
void scalar_kernel(ScalarOp op, const Tensor& x, wide_t<T> s, const Tensor& out) {
  using W = wide_t<T>;
  switch (op) {
    case ScalarOp::add: return map_flat<T>(x, out, [s](W v) { return v + s; });
    case ScalarOp::mul: return map_flat<T>(x, out, [s](W v) { return v * s; });
    case ScalarOp::pow: return map_flat<T>(x, out, [s](W v) { return std::pow(v, s); });
    case ScalarOp::rsub: return map_flat<T>(x, out, [s](W v) { return s - v; });
    case ScalarOp::rdiv: return map_flat<T>(x, out, [s](W v) { return s / v; });
    case ScalarOp::maximum: return map_flat<T>(x, out, [s](W v) { return max_nan(v, s); });
    case ScalarOp::minimum: return map_flat<T>(x, out, [s](W v) { return min_nan(v, s); });
    case ScalarOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("scalar_op on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

template <class T, class F>
void zip_strided(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const T* pa = ptr<T>(a);
  const T* pb = ptr<T>(b);
  T* po = ptr<T>(out);
  for_each_offset<3>(out.shape(), {out.strides(), a.strides(), b.strides()},
                     [&](int64_t oo, int64_t oa, int64_t ob) { po[oo] = narrow<T>(f(widen(pa[oa]), widen(pb[ob]))); });
}

template <class T>
void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  using W = wide_t<T>;
  switch (op) {
    case BinaryOp::add: return zip_strided<T>(a, b, out, [](W u, W v) { return u + v; });
    case BinaryOp::sub: return zip_strided<T>(a, b, out, [](W u, W v) { return u - v; });
    case BinaryOp::mul: return zip_strided<T>(a, b, out, [](W u, W v) { return u * v; });
    case BinaryOp::div: return zip_strided<T>(a, b, out, [](W u, W v) { return u / v; });
    case BinaryOp::maximum: return zip_strided<T>(a, b, out, [](W u, W v) { return max_nan(u, v); });
    case BinaryOp::minimum: return zip_strided<T>(a, b, out, [](W u, W v) { return min_nan(u, v); });
    case BinaryOp::eq: return zip_strided<T>(a, b, out, [](W u, W v) { return u == v ? W(1) : W(0); });
    case BinaryOp::gt: return zip_strided<T>(a, b, out, [](W u, W v) { return u > v ? W(1) : W(0); });
    case BinaryOp::lt: return zip_strided<T>(a, b, out, [](W u, W v) { return u < v ? W(1) : W(0); });
    case BinaryOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("binary on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

// The formulas are engine/scalar_math.h's (ActivationFn), shared with the cpu and CUDA backends;
// with_activation picks the activation once, outside the element loop. f32 runs in f32, as in PyTorch.
template <class T>
void activation_kernel(Activation act, wide_t<T> alpha, const Tensor& x, const Tensor& out) {
  using W = wide_t<T>;
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    map_flat<T>(x, out, [alpha](W v) { return Fn::value(v, alpha); });
  });
}

// dx = dy * f'(x).
template <class T>
void activation_backward_kernel(Activation act, wide_t<T> alpha, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    const T* px = ptr<T>(x);
    const T* pdy = ptr<T>(dy);
    T* pdx = ptr<T>(dx);
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) pdx[i] = narrow<T>(widen(pdy[i]) * Fn::derivative(widen(px[i]), alpha));
  });
}

}  // namespace

void ReferenceBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  dispatch_float_or_half(x.dtype(), unary_name(op), [&](auto tag) { unary_kernel<decltype(tag)>(op, x, out); });
}

void ReferenceBackend::scalar_op(ScalarOp op, const Tensor& x, double s, const Tensor& out) {
  dispatch_float_or_half(x.dtype(), scalar_op_name(op), [&](auto tag) {
    using T = decltype(tag);
    scalar_kernel<T>(op, x, static_cast<wide_t<T>>(s), out);
  });
}

void ReferenceBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float_or_half(out.dtype(), binary_name(op), [&](auto tag) { binary_kernel<decltype(tag)>(op, a, b, out); });
}

void ReferenceBackend::activation(Activation act, double alpha, const Tensor& x, const Tensor& out) {
  dispatch_float_or_half(x.dtype(), activation_name(act), [&](auto tag) {
    using T = decltype(tag);
    activation_kernel<T>(act, static_cast<wide_t<T>>(alpha), x, out);
  });
}

void ReferenceBackend::activation_backward(Activation act, double alpha, const Tensor& x, const Tensor& dy,
                                           const Tensor& dx) {
  dispatch_float_or_half(x.dtype(), "activation_backward", [&](auto tag) {
    using T = decltype(tag);
    activation_backward_kernel<T>(act, static_cast<wide_t<T>>(alpha), x, dy, dx);
  });
}

// Element i of the flat span keeps its value iff uniform01(seed, offset + i) >= p, so the mask is
// a pure function of (seed, offset) and a CUDA kernel walking the same span draws the same one.
// Kept elements are scaled by 1 / (1 - p) so the expectation of y is x.
void ReferenceBackend::dropout(const Tensor& x, const Tensor& y, const Tensor& mask, double p, uint64_t seed,
                               uint64_t offset) {
  dispatch_float_or_half(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    using W = wide_t<T>;
    const T* px = ptr<T>(x);
    T* py = ptr<T>(y);
    T* pm = ptr<T>(mask);
    const W scale = p < 1.0 ? static_cast<W>(1.0 / (1.0 - p)) : W(0);
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = uniform01(seed, offset + static_cast<uint64_t>(i)) >= p;
      pm[i] = narrow<T>(keep ? scale : W(0));
      py[i] = narrow<T>(widen(px[i]) * widen(pm[i]));
    }
  });
}

}  // namespace duet
