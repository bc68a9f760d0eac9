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

template <class T>
T sigmoid(T x) { return T(1) / (T(1) + std::exp(-x)); }

template <class T>
T relu6(T x) { return std::min(std::max(x, T(0)), T(6)); }

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
  }
  throw Error(fmt::format("binary on backend 'reference': unknown op code {}", static_cast<int>(op)));
}

// The constants of the two GELU forms, in T so f32 runs in f32 as PyTorch does.
template <class T> constexpr T kInvSqrt2 = T(0.70710678118654752440);
template <class T> constexpr T kInvSqrt2Pi = T(0.39894228040143267794);  // 1 / sqrt(2 pi): the normal density's scale
template <class T> constexpr T kSqrt2OverPi = T(0.79788456080286535588);
template <class T> constexpr T kGeluCubic = T(0.044715);

template <class T>
void activation_kernel(Activation act, const Tensor& x, const Tensor& out) {
  switch (act) {
    case Activation::relu:  // written so that a NaN passes through, as in PyTorch
      return map_flat<T>(x, out, [](T v) { return v < T(0) ? T(0) : v; });
    case Activation::relu6: return map_flat<T>(x, out, [](T v) { return relu6(v); });
    case Activation::gelu_erf:
      return map_flat<T>(x, out, [](T v) { return T(0.5) * v * (T(1) + std::erf(v * kInvSqrt2<T>)); });
    case Activation::gelu_tanh:
      return map_flat<T>(x, out, [](T v) {
        return T(0.5) * v * (T(1) + std::tanh(kSqrt2OverPi<T> * (v + kGeluCubic<T> * v * v * v)));
      });
    case Activation::sigmoid: return map_flat<T>(x, out, [](T v) { return sigmoid(v); });
    case Activation::silu: return map_flat<T>(x, out, [](T v) { return v * sigmoid(v); });
    case Activation::hardswish: return map_flat<T>(x, out, [](T v) { return v * relu6(v + T(3)) / T(6); });
  }
  throw Error(fmt::format("activation on backend 'reference': unknown activation code {}", static_cast<int>(act)));
}

// dx = dy * f'(x). At kinks the derivative takes PyTorch's one-sided choice, so gradients match
// it bit for bit on integer-valued inputs (common in tests).
template <class T, class F>
void backward_flat(const Tensor& x, const Tensor& dy, const Tensor& dx, F dfdx) {
  const T* px = x.data<T>();
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) pdx[i] = pdy[i] * dfdx(px[i]);
}

template <class T>
void activation_backward_kernel(Activation act, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  switch (act) {
    case Activation::relu: return backward_flat<T>(x, dy, dx, [](T v) { return v > T(0) ? T(1) : T(0); });
    case Activation::relu6:
      return backward_flat<T>(x, dy, dx, [](T v) { return (v > T(0) && v < T(6)) ? T(1) : T(0); });
    case Activation::gelu_erf:
      // d/dx [x Phi(x)] = Phi(x) + x phi(x)
      return backward_flat<T>(x, dy, dx, [](T v) {
        const T cdf = T(0.5) * (T(1) + std::erf(v * kInvSqrt2<T>));
        const T pdf = kInvSqrt2Pi<T> * std::exp(T(-0.5) * v * v);
        return cdf + v * pdf;
      });
    case Activation::gelu_tanh:
      // Product rule on 0.5 x (1 + tanh(inner)), arranged as PyTorch's kernel does.
      return backward_flat<T>(x, dy, dx, [](T v) {
        const T inner = kSqrt2OverPi<T> * (v + kGeluCubic<T> * v * v * v);
        const T t = std::tanh(inner);
        const T d_inner = kSqrt2OverPi<T> * (T(1) + T(3) * kGeluCubic<T> * v * v);
        return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * d_inner;
      });
    case Activation::sigmoid:
      return backward_flat<T>(x, dy, dx, [](T v) {
        const T s = sigmoid(v);
        return s * (T(1) - s);
      });
    case Activation::silu:
      return backward_flat<T>(x, dy, dx, [](T v) {
        const T s = sigmoid(v);
        return s * (T(1) + v * (T(1) - s));
      });
    case Activation::hardswish:
      return backward_flat<T>(x, dy, dx, [](T v) {
        if (v < T(-3)) return T(0);
        if (v <= T(3)) return v / T(3) + T(0.5);
        return T(1);
      });
  }
  throw Error(fmt::format("activation_backward on backend 'reference': unknown activation code {}",
                          static_cast<int>(act)));
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

void ReferenceBackend::activation(Activation act, const Tensor& x, const Tensor& out) {
  dispatch_float(x.dtype(), activation_name(act), [&](auto tag) { activation_kernel<decltype(tag)>(act, x, out); });
}

void ReferenceBackend::activation_backward(Activation act, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  dispatch_float(x.dtype(), "activation_backward",
                 [&](auto tag) { activation_backward_kernel<decltype(tag)>(act, x, dy, dx); });
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
