// Helpers shared by the reference kernels: dtype dispatch, an N-d strided index walker and a 4-D
// strided view. Everything here is plain C++ so the kernels read as the maths they implement.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <tuple>
#include <type_traits>
#include <utility>
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/half.h"
#include "engine/scalar_math.h"
#include "engine/tensor.h"

namespace duet::ref {

[[noreturn]] inline void unsupported_dtype(const char* op, DType t, const char* expected = "f32 or f64") {
  throw Error(fmt::format("{} on backend 'reference': dtype {} is not supported, expected {}", op, dtype_name(t),
                          expected));
}

// Calls f(T{}) with T = float or double according to t, so a kernel is written once as a
// template: dispatch_float(x.dtype(), "conv2d", [&](auto tag) { using T = decltype(tag); ... }).
template <class F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default: unsupported_dtype(op, t);
  }
}

// The GEMM-heavy kernels (conv2d, matmul, linear) also take the mixed-precision dtypes: T is float,
// double, Half or BFloat16 (the 16-bit ones as bit patterns, read with widen() and written with
// narrow<T>(), both in half.h).
template <class F>
void dispatch_float_or_half(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(Half{}); return;
    case DType::bf16: f(BFloat16{}); return;
    default: unsupported_dtype(op, t, "f32, f64, f16 or bf16");
  }
}

// The accumulator of a kernel over storage type T. f32 and f64 accumulate in double (the
// reference is the oracle of the f32 backends); f16 and bf16 accumulate in float, which is what
// cuDNN, cuBLAS (CUBLAS_COMPUTE_32F) and oneDNN do for them, and round once when storing.
template <class T>
using acc_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, double>;

// Calls f(offsets...) once per element of `shape`, in row-major order, where offsets[k] is the
// element's offset under strides[k]. Stride 0 expresses broadcasting. The walk keeps running
// offsets instead of recomputing sum(index * stride), and the last dimension is a plain loop the
// compiler can unroll.
template <size_t N, class F>
void for_each_offset(const Shape& shape, const std::array<Shape, N>& strides, F&& f) {
  const int64_t nd = static_cast<int64_t>(shape.size());
  for (int64_t s : shape)
    if (s == 0) return;
  std::array<int64_t, N> off{};
  if (nd == 0) {
    std::apply(f, off);
    return;
  }
  const int64_t inner = shape[nd - 1];
  std::array<int64_t, N> inner_stride;
  for (size_t k = 0; k < N; ++k) inner_stride[k] = strides[k][nd - 1];
  Shape index(nd, 0);
  for (;;) {
    std::array<int64_t, N> o = off;
    for (int64_t i = 0; i < inner; ++i) {
      std::apply(f, o);
      for (size_t k = 0; k < N; ++k) o[k] += inner_stride[k];
    }
    // Odometer over the outer dimensions: bump the last one that has room, rewind those after it.
    int64_t d = nd - 2;
    for (; d >= 0; --d) {
      for (size_t k = 0; k < N; ++k) off[k] += strides[k][d];
      if (++index[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// A copy of s without dimension d: the outer index space of a loop that runs along d.
inline Shape drop_dim(const Shape& s, int64_t d) {
  Shape r = s;
  r.erase(r.begin() + d);
  return r;
}

// Sizes and strides of a 4-D [N, C, H, W] tensor. Kernels index through the strides, so NCHW and
// channels-last inputs take the same code path. A 2-D [N, C] tensor is read as [N, C, 1, 1].
struct View4 {
  int64_t N = 1, C = 1, H = 1, W = 1;
  int64_t sN = 0, sC = 0, sH = 0, sW = 0;
  explicit View4(const Tensor& t) {
    const Shape& sh = t.shape();
    const Shape& st = t.strides();
    DUET_CHECK(sh.size() == 4 || sh.size() == 2, "reference backend: expected a 4-D [N, C, H, W] or 2-D [N, C] tensor, got shape {}",
               shape_str(sh));
    N = sh[0], C = sh[1], sN = st[0], sC = st[1];
    if (sh.size() == 4) H = sh[2], W = sh[3], sH = st[2], sW = st[3];
  }
  int64_t at(int64_t n, int64_t c, int64_t h, int64_t w) const { return n * sN + c * sC + h * sH + w * sW; }
};

}  // namespace duet::ref
