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
template <class T, class F>
void map_flat(const Tensor& x, const Tensor& out, F f) {
  const T* in = x.data<T>();
  T* o = out.data<T>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = f(in[i]);
}

// Each switch picks a lambda once, outside the element loop.
template <class T>
void unary_kernel(UnaryOp op, const Tensor& x, const Tensor& out) {
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
  throw Error(fmt::format("unary on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

template <class T>
void scalar_kernel(ScalarOp op, const Tensor& x, T s, const Tensor& out) {
  switch (op) {
    case ScalarOp::add: return map_flat<T>(x, out, [s](T v) { return v + s; });
    case ScalarOp::mul: return map_flat<T>(x, out, [s](T v) { return v * s; });
    case ScalarOp::pow: return map_flat<T>(x, out, [s](T v) { return std::pow(v, s); });
    case ScalarOp::rsub: return map_flat<T>(x, out, [s](T v) { return s - v; });
    case ScalarOp::rdiv: return map_flat<T>(x, out, [s](T v) { return s / v; });
    case ScalarOp::maximum: return map_flat<T>(x, out, [s](T v) { return max_nan(v, s); });
    case ScalarOp::minimum: return map_flat<T>(x, out, [s](T v) { return min_nan(v, s); });
    case ScalarOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("scalar_op on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

template <class T, class F>
void zip_strided(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for_each_offset<3>(out.shape(), {out.strides(), a.strides(), b.strides()},
                     [&](int64_t oo, int64_t oa, int64_t ob) { po[oo] = f(pa[oa], pb[ob]); });
}

template <class T>
void binary_kernel(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
    case BinaryOp::add: return zip_strided<T>(a, b, out, [](T u, T v) { return u + v; });
    case BinaryOp::sub: return zip_strided<T>(a, b, out, [](T u, T v) { return u - v; });
    case BinaryOp::mul: return zip_strided<T>(a, b, out, [](T u, T v) { return u * v; });
    case BinaryOp::div: return zip_strided<T>(a, b, out, [](T u, T v) { return u / v; });
    case BinaryOp::maximum: return zip_strided<T>(a, b, out, [](T u, T v) { return max_nan(u, v); });
    case BinaryOp::minimum: return zip_strided<T>(a, b, out, [](T u, T v) { return min_nan(u, v); });
    case BinaryOp::eq: return zip_strided<T>(a, b, out, [](T u, T v) { return u == v ? T(1) : T(0); });
    case BinaryOp::gt: return zip_strided<T>(a, b, out, [](T u, T v) { return u > v ? T(1) : T(0); });
    case BinaryOp::lt: return zip_strided<T>(a, b, out, [](T u, T v) { return u < v ? T(1) : T(0); });
    case BinaryOp::count: break;  // not an op: the enum's size
  }
  throw Error(fmt::format("binary on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

// The formulas are engine/scalar_math.h's (ActivationFn), shared with the cpu and CUDA backends;
// with_activation picks the activation once, outside the element loop. f32 runs in f32, as in PyTorch.
template <class T>
void activation_kernel(Activation act, T alpha, const Tensor& x, const Tensor& out) {
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    map_flat<T>(x, out, [alpha](T v) { return Fn::value(v, alpha); });
  });
}

// dx = dy * f'(x).
template <class T>
void activation_backward_kernel(Activation act, T alpha, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  with_activation(act, [&](auto fn) {
    using Fn = decltype(fn);
    const T* px = x.data<T>();
    const T* pdy = dy.data<T>();
    T* pdx = dx.data<T>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) pdx[i] = pdy[i] * Fn::derivative(px[i], alpha);
  });
}

}  // namespace

void ReferenceBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), unary_name(op), [&](auto tag) { unary_kernel<decltype(tag)>(op, x, out); });
}

void ReferenceBackend::scalar_op(ScalarOp op, const Tensor& x, double s, const Tensor& out) {
  dispatch_float(x.dtype(), scalar_op_name(op), [&](auto tag) {
    using T = decltype(tag);
    scalar_kernel<T>(op, x, static_cast<T>(s), out);
  });
}

void ReferenceBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_float(out.dtype(), binary_name(op), [&](auto tag) { binary_kernel<decltype(tag)>(op, a, b, out); });
}

void ReferenceBackend::activation(Activation act, double alpha, const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), activation_name(act), [&](auto tag) {
    using T = decltype(tag);
    activation_kernel<T>(act, T(alpha), x, out);
  });
}

void ReferenceBackend::activation_backward(Activation act, double alpha, const Tensor& x, const Tensor& dy,
                                           const Tensor& dx) {
  dispatch_float(x.dtype(), "activation_backward",
                 [&](auto tag) { activation_backward_kernel<decltype(tag)>(act, decltype(tag)(alpha), x, dy, dx); });
}

// Element i of the flat span keeps its value iff uniform01(seed, offset + i) >= p, so the mask is
// a pure function of (seed, offset) and a CUDA kernel walking the same span draws the same one.
// Kept elements are scaled by 1 / (1 - p) so the expectation of y is x.
void ReferenceBackend::dropout(const Tensor& x, const Tensor& y, const Tensor& mask, double p, uint64_t seed,
                               uint64_t offset) {
  dispatch_float(x.dtype(), "dropout", [&](auto tag) {
    using T = decltype(tag);
    const T* px = x.data<T>();
    T* py = y.data<T>();
    T* pm = mask.data<T>();
    const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      const bool keep = uniform01(seed, offset + static_cast<uint64_t>(i)) >= p;
      pm[i] = keep ? scale : T(0);
      py[i] = px[i] * pm[i];
    }
  });
}

}  // namespace duet
