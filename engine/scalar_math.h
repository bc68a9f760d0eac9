// Per-element arithmetic that every backend must compute the same way, written once as functions
// that compile for the host and, under nvcc, for the GPU: the reference loops, the cpu backend's
// OpenMP loops and the CUDA kernels all call these. It includes no engine header that pulls in fmt
// or the tensor, so nvcc can parse it.
#pragma once
#include <math.h>
#include <cstdint>
#include "engine/op_params.h"

#if defined(__CUDACC__)
#define DUET_HD __host__ __device__
#else
#define DUET_HD
#endif

namespace duet {

// ---- one name for float and double (the C library's, qualified: duet:: has tensor exp, log, ...) ----
DUET_HD inline float k_exp(float x) { return ::expf(x); }
DUET_HD inline double k_exp(double x) { return ::exp(x); }
DUET_HD inline float k_log(float x) { return ::logf(x); }
DUET_HD inline double k_log(double x) { return ::log(x); }
DUET_HD inline float k_sqrt(float x) { return ::sqrtf(x); }
DUET_HD inline double k_sqrt(double x) { return ::sqrt(x); }
DUET_HD inline float k_tanh(float x) { return ::tanhf(x); }
DUET_HD inline double k_tanh(double x) { return ::tanh(x); }
DUET_HD inline float k_erf(float x) { return ::erff(x); }
DUET_HD inline double k_erf(double x) { return ::erf(x); }
DUET_HD inline float k_abs(float x) { return ::fabsf(x); }
DUET_HD inline double k_abs(double x) { return ::fabs(x); }
DUET_HD inline float k_pow(float x, float y) { return ::powf(x, y); }
DUET_HD inline double k_pow(double x, double y) { return ::pow(x, y); }
DUET_HD inline float k_nextafter(float x, float y) { return ::nextafterf(x, y); }
DUET_HD inline double k_nextafter(double x, double y) { return ::nextafter(x, y); }

template <class T> DUET_HD inline bool is_nan(T v) { return v != v; }

// max/min that propagate NaN, as PyTorch's maximum/minimum/amax/amin do (std::max would drop a NaN
// in its second argument).
template <class T> DUET_HD inline T max_nan(T a, T b) { return is_nan(a) ? a : is_nan(b) ? b : (a < b ? b : a); }
template <class T> DUET_HD inline T min_nan(T a, T b) { return is_nan(a) ? a : is_nan(b) ? b : (b < a ? b : a); }


// ---- batch norm's statistics ------------------------------------------------------------------------
// The batch is normalised with its biased variance: invstd = 1 / sqrt(var + eps).
DUET_HD inline double inv_std(double biased_var, double eps) { return 1.0 / k_sqrt(biased_var + eps); }
// The running statistics follow PyTorch: r <- (1 - momentum) r + momentum * batch value, where the
// variance that goes in is the unbiased estimate var * n / (n - 1) of the n values per channel (the
// biased one when n is 1). cuDNN's exponentialAverageFactor = momentum does the same.
DUET_HD inline double running_update(double running, double batch, double momentum) {
  return (1.0 - momentum) * running + momentum * batch;
}
DUET_HD inline double unbiased_var(double biased_var, int64_t n) {
  return n > 1 ? biased_var * double(n) / double(n - 1) : biased_var;
}

// ---- pooling windows --------------------------------------------------------------------------------
// Input rows [h0, h1) a pooling window covers, padding removed (same along the width).
struct PoolRange {
  int64_t begin, end;
};
DUET_HD inline PoolRange pool_window(int64_t o, int64_t k, int64_t s, int64_t p, int64_t in) {
  const int64_t start = o * s - p;
  return {start < 0 ? 0 : start, start + k < in ? start + k : in};
}

// PyTorch's average-pooling divisor for output (oh, ow): with count_include_pad the window counts up
// to the padded border (a ceil-mode window hanging past it does not count its overhang), otherwise
// only the real input elements it covers.
DUET_HD inline int64_t avg_divisor(int64_t oh, int64_t ow, int64_t H, int64_t W, int64_t kh, int64_t kw, int64_t sh,
                                   int64_t sw, int64_t ph, int64_t pw, bool count_include_pad) {
  const PoolRange rh = pool_window(oh, kh, sh, ph, H), rw = pool_window(ow, kw, sw, pw, W);
  if (!count_include_pad) return (rh.end - rh.begin) * (rw.end - rw.begin);
  const int64_t hs = oh * sh - ph, ws = ow * sw - pw;
  const int64_t he = hs + kh < H + ph ? hs + kh : H + ph, we = ws + kw < W + pw ? ws + kw : W + pw;
  return (he - hs) * (we - ws);
}

// The outputs whose windows contain input index i: [first, last] (empty when first > last).
DUET_HD inline PoolRange windows_containing(int64_t i, int64_t k, int64_t s, int64_t p, int64_t out) {
  const int64_t num = i + p - k + 1;  // o * s >= i + p - k + 1
  const int64_t first = num <= 0 ? 0 : (num + s - 1) / s;
  const int64_t last_unclamped = (i + p) / s;  // o * s <= i + p
  return {first, last_unclamped < out - 1 ? last_unclamped : out - 1};
}

// PyTorch's adaptive bins: output o of n_out over n_in inputs covers [floor(o n_in / n_out), ceil((o+1) n_in / n_out)).
DUET_HD inline int64_t bin_start(int64_t o, int64_t n_in, int64_t n_out) { return (o * n_in) / n_out; }
DUET_HD inline int64_t bin_end(int64_t o, int64_t n_in, int64_t n_out) { return ((o + 1) * n_in + n_out - 1) / n_out; }

// Candidate bins [first, last] that may contain input index i; a superset (callers test each with
// bin_start/bin_end). Bin o contains i only if (i - 1) n_out / n_in - 1 < o <= (i + 1) n_out / n_in.
DUET_HD inline PoolRange bins_containing(int64_t i, int64_t n_in, int64_t n_out) {
  const int64_t lo = ((i - 1) * n_out) / n_in - 1, hi = ((i + 1) * n_out) / n_in;
  return {lo < 0 ? 0 : lo, hi < n_out - 1 ? hi : n_out - 1};
}

// The same for both spatial dims of output (oh, ow): input rows [h0, h1) and columns [w0, w1).
struct PoolWindow {
  int64_t h0, h1, w0, w1;
};
DUET_HD inline PoolWindow pool_window(const Pool2dParams& p, int64_t oh, int64_t ow, int64_t H, int64_t W) {
  const PoolRange r = pool_window(oh, p.kernel_h, p.stride_h, p.pad_h, H);
  const PoolRange c = pool_window(ow, p.kernel_w, p.stride_w, p.pad_w, W);
  return {r.begin, r.end, c.begin, c.end};
}
DUET_HD inline int64_t avg_divisor(const Pool2dParams& p, int64_t oh, int64_t ow, int64_t H, int64_t W) {
  return avg_divisor(oh, ow, H, W, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.count_include_pad);
}

// Max pooling's argmax as stored (ops.def: max_pool2d's indices): the offset kh * kernel_w + kw of
// input (h, w) within output (oh, ow)'s window, padding counted (oneDNN's workspace convention).
DUET_HD inline int64_t window_offset(const Pool2dParams& p, int64_t oh, int64_t ow, int64_t h, int64_t w) {
  return (h - (oh * p.stride_h - p.pad_h)) * p.kernel_w + (w - (ow * p.stride_w - p.pad_w));
}
struct WindowPos {
  int64_t h, w;
};
DUET_HD inline WindowPos window_position(const Pool2dParams& p, int64_t oh, int64_t ow, int64_t offset) {
  return {oh * p.stride_h - p.pad_h + offset / p.kernel_w, ow * p.stride_w - p.pad_w + offset % p.kernel_w};
}

// Whether v is the maximum m of its window, for max pooling's gradient (which goes to the first
// such position): a NaN maximum is matched by a NaN.
template <class T> DUET_HD inline bool is_window_max(T v, T m) { return v == m || (is_nan(v) && is_nan(m)); }

// ---- activations -------------------------------------------------------------------------------
// Everything about one activation in one place: its op name (as reports show it), its nn module
// name, its parameter's default (alpha: LeakyReLU's slope; unused by most), its FLOPs per element
// for the roofline, its value and its derivative (both given alpha), with PyTorch's
// definitions and its one-sided choices at kinks (relu'(0) = 0, hardswish'(3) = 1.5), so gradients
// match PyTorch bit for bit on integer-valued inputs. with_activation() below turns the run-time
// choice into one of these types once per tensor, so no loop switches per element.
template <Activation A> struct ActivationFn;

template <class T> DUET_HD inline T sigmoid_of(T v) { return T(1) / (T(1) + k_exp(-v)); }
// Both clamps written so that a NaN passes through, as in PyTorch (std::clamp-like code would not).
template <class T> DUET_HD inline T relu6_of(T v) {
  const T lo = v < T(0) ? T(0) : v;
  return T(6) < lo ? T(6) : lo;
}
template <class T> constexpr T kInvSqrt2 = T(0.70710678118654752440);
template <class T> constexpr T kInvSqrt2Pi = T(0.39894228040143267794);  // the normal density's scale
template <class T> constexpr T kSqrt2OverPi = T(0.79788456080286535588);
template <class T> constexpr T kGeluCubic = T(0.044715);

template <> struct ActivationFn<Activation::relu> {
  static constexpr const char* name = "relu";
  static constexpr const char* module = "ReLU";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 1;
  template <class T> DUET_HD static T value(T v, T) { return v < T(0) ? T(0) : v; }
  template <class T> DUET_HD static T derivative(T v, T) { return v > T(0) ? T(1) : T(0); }
};

template <> struct ActivationFn<Activation::relu6> {
  static constexpr const char* name = "relu6";
  static constexpr const char* module = "ReLU6";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 1;
  template <class T> DUET_HD static T value(T v, T) { return relu6_of(v); }
  template <class T> DUET_HD static T derivative(T v, T) { return (v > T(0) && v < T(6)) ? T(1) : T(0); }
};

// x Phi(x), Phi the normal distribution function; d/dx = Phi(x) + x phi(x).
template <> struct ActivationFn<Activation::gelu_erf> {
  static constexpr const char* name = "gelu";
  static constexpr const char* module = "GELU";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 8;  // transcendental: counted as a handful of FLOPs
  template <class T> DUET_HD static T value(T v, T) { return T(0.5) * v * (T(1) + k_erf(v * kInvSqrt2<T>)); }
  template <class T> DUET_HD static T derivative(T v, T) {
    const T cdf = T(0.5) * (T(1) + k_erf(v * kInvSqrt2<T>));
    const T pdf = kInvSqrt2Pi<T> * k_exp(T(-0.5) * v * v);
    return cdf + v * pdf;
  }
};

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); the derivative arranged as PyTorch's kernel.
template <> struct ActivationFn<Activation::gelu_tanh> {
  static constexpr const char* name = "gelu_tanh";
  static constexpr const char* module = "GELU";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 8;
  template <class T> DUET_HD static T value(T v, T) {
    return T(0.5) * v * (T(1) + k_tanh(kSqrt2OverPi<T> * (v + kGeluCubic<T> * v * v * v)));
  }
  template <class T> DUET_HD static T derivative(T v, T) {
    const T t = k_tanh(kSqrt2OverPi<T> * (v + kGeluCubic<T> * v * v * v));
    const T d_inner = kSqrt2OverPi<T> * (T(1) + T(3) * kGeluCubic<T> * v * v);
    return T(0.5) * (T(1) + t) + T(0.5) * v * (T(1) - t * t) * d_inner;
  }
};

template <> struct ActivationFn<Activation::sigmoid> {
  static constexpr const char* name = "sigmoid";
  static constexpr const char* module = "Sigmoid";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 8;
  template <class T> DUET_HD static T value(T v, T) { return sigmoid_of(v); }
  template <class T> DUET_HD static T derivative(T v, T) {
    const T s = sigmoid_of(v);
    return s * (T(1) - s);
  }
};

template <> struct ActivationFn<Activation::silu> {
  static constexpr const char* name = "silu";
  static constexpr const char* module = "SiLU";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 8;
  template <class T> DUET_HD static T value(T v, T) { return v * sigmoid_of(v); }
  template <class T> DUET_HD static T derivative(T v, T) {
    const T s = sigmoid_of(v);
    return s * (T(1) + v * (T(1) - s));
  }
};

template <> struct ActivationFn<Activation::hardswish> {
  static constexpr const char* name = "hardswish";
  static constexpr const char* module = "Hardswish";
  static constexpr double default_alpha = 0;  // no parameter
  static constexpr double flops = 4;
  template <class T> DUET_HD static T value(T v, T) { return v * relu6_of(v + T(3)) / T(6); }
  template <class T> DUET_HD static T derivative(T v, T) {
    if (v < T(-3)) return T(0);
    if (v <= T(3)) return v / T(3) + T(0.5);
    return T(1);
  }
};

// x for x > 0, else alpha x (Darknet's "leaky" uses alpha 0.1; PyTorch's default is 0.01). The
// derivative at 0 is alpha, as PyTorch's leaky_relu_backward gives; a NaN passes through.
template <> struct ActivationFn<Activation::leaky_relu> {
  static constexpr const char* name = "leaky_relu";
  static constexpr const char* module = "LeakyReLU";
  static constexpr double default_alpha = 0.01;
  static constexpr double flops = 2;
  template <class T> DUET_HD static T value(T v, T alpha) { return v > T(0) ? v : v * alpha; }
  template <class T> DUET_HD static T derivative(T v, T alpha) { return v > T(0) ? T(1) : alpha; }
};

// Calls f(ActivationFn<act>{}) and returns what it returns. The one switch over activations: a
// new activation is a new enumerator, a new struct above and a new case here (the compiler's
// -Wswitch names a missing case; a code out of range stops the host and traps on the GPU).
template <class F> DUET_HD inline decltype(auto) with_activation(Activation act, F&& f) {
  switch (act) {
    case Activation::relu: return f(ActivationFn<Activation::relu>{});
    case Activation::relu6: return f(ActivationFn<Activation::relu6>{});
    case Activation::gelu_erf: return f(ActivationFn<Activation::gelu_erf>{});
    case Activation::gelu_tanh: return f(ActivationFn<Activation::gelu_tanh>{});
    case Activation::sigmoid: return f(ActivationFn<Activation::sigmoid>{});
    case Activation::silu: return f(ActivationFn<Activation::silu>{});
    case Activation::hardswish: return f(ActivationFn<Activation::hardswish>{});
    case Activation::leaky_relu: return f(ActivationFn<Activation::leaky_relu>{});
    case Activation::count: break;
  }
#if defined(__CUDA_ARCH__)
  __trap();
#else
  bad_activation(act);
#endif
}

// The run-time forms, for the CUDA kernels (one kernel serves every activation) and for tests.
template <class T> DUET_HD inline T activation_value(Activation act, T v, T alpha = T(0)) {
  return with_activation(act, [v, alpha](auto fn) { return decltype(fn)::value(v, alpha); });
}
template <class T> DUET_HD inline T activation_derivative(Activation act, T v, T alpha = T(0)) {
  return with_activation(act, [v, alpha](auto fn) { return decltype(fn)::derivative(v, alpha); });
}

}  // namespace duet
