// 2-D pooling on the host: max, average and adaptive average, forward and backward. Each output
// element is computed from its window by direct loops, indexing through strides so NCHW and
// channels-last share the code. Backward passes zero dx and scatter into it, since windows overlap.
#include <algorithm>
#include <cmath>
#include <limits>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

// Calls f(n, c, oh, ow) for every element of a 4-D output.
template <class F>
void for_each_output(const View4& v, F f) {
  for (int64_t n = 0; n < v.N; ++n)
    for (int64_t c = 0; c < v.C; ++c)
      for (int64_t oh = 0; oh < v.H; ++oh)
        for (int64_t ow = 0; ow < v.W; ++ow) f(n, c, oh, ow);
}

template <class T>
void zero(const Tensor& t) {
  const View4 V(t);
  T* p = t.data<T>();
  for_each_output(V, [&](int64_t n, int64_t c, int64_t h, int64_t w) { p[V.at(n, c, h, w)] = T(0); });
}

// Windows, divisors and adaptive bins are engine/scalar_math.h's, shared with the other backends.

// Padding acts as -infinity: only real input elements can win. A NaN wins over everything, as
// in PyTorch.
template <class T>
void max_pool2d_kernel(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  const View4 X(x), Y(y);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  uint8_t* pi = indices.defined() ? indices.data<uint8_t>() : nullptr;
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
    T best = -std::numeric_limits<T>::infinity();
    int64_t bh = win.h0, bw = win.w0;  // the first position, should every value be -inf
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) {
        const T v = px[X.at(n, c, h, w)];
        if (v > best || (std::isnan(v) && !std::isnan(best))) best = v, bh = h, bw = w;
      }
    py[Y.at(n, c, oh, ow)] = best;
    if (pi) pi[Y.at(n, c, oh, ow)] = static_cast<uint8_t>(window_offset(p, oh, ow, bh, bw));
  });
}

// The gradient of each output goes to the first window position (row-major) holding the maximum:
// the one the forward recorded, or, without indices, found again by comparing x with y.
template <class T>
void max_pool2d_backward_kernel(const Tensor& x, const Tensor& y, const Tensor& indices, const Tensor& dy,
                                const Tensor& dx, const Pool2dParams& p) {
  const View4 DY(dy), DX(dx);
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  zero<T>(dx);
  if (indices.defined()) {
    const View4 I(indices);
    const uint8_t* pi = indices.data<uint8_t>();
    for_each_output(DY, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
      const WindowPos at = window_position(p, oh, ow, pi[I.at(n, c, oh, ow)]);
      pdx[DX.at(n, c, at.h, at.w)] += pdy[DY.at(n, c, oh, ow)];
    });
    return;
  }
  const View4 X(x), Y(y);
  const T* px = x.data<T>();
  const T* py = y.data<T>();
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
    const T target = py[Y.at(n, c, oh, ow)];
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) {
        const T v = px[X.at(n, c, h, w)];
        if (is_window_max(v, target)) {
          pdx[DX.at(n, c, h, w)] += pdy[DY.at(n, c, oh, ow)];
          return;
        }
      }
  });
}

template <class T>
void avg_pool2d_kernel(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  const View4 X(x), Y(y);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
    if (win.h0 >= win.h1 || win.w0 >= win.w1) {  // a window entirely in padding averages to 0
      py[Y.at(n, c, oh, ow)] = T(0);
      return;
    }
    double sum = 0.0;
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) sum += px[X.at(n, c, h, w)];
    py[Y.at(n, c, oh, ow)] = static_cast<T>(sum / double(avg_divisor(p, oh, ow, X.H, X.W)));
  });
}

template <class T>
void avg_pool2d_backward_kernel(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  const View4 DY(dy), DX(dx);
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  zero<T>(dx);
  for_each_output(DY, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, DX.H, DX.W);
    if (win.h0 >= win.h1 || win.w0 >= win.w1) return;
    const T g = static_cast<T>(double(pdy[DY.at(n, c, oh, ow)]) / double(avg_divisor(p, oh, ow, DX.H, DX.W)));
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) pdx[DX.at(n, c, h, w)] += g;
  });
}

template <class T>
void adaptive_avg_pool2d_kernel(const Tensor& x, const Tensor& y) {
  const View4 X(x), Y(y);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const int64_t h0 = bin_start(oh, X.H, Y.H), h1 = bin_end(oh, X.H, Y.H);
    const int64_t w0 = bin_start(ow, X.W, Y.W), w1 = bin_end(ow, X.W, Y.W);
    double sum = 0.0;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) sum += px[X.at(n, c, h, w)];
    py[Y.at(n, c, oh, ow)] = static_cast<T>(sum / double((h1 - h0) * (w1 - w0)));
  });
}

template <class T>
void adaptive_avg_pool2d_backward_kernel(const Tensor& dy, const Tensor& dx) {
  const View4 DY(dy), DX(dx);
  const T* pdy = dy.data<T>();
  T* pdx = dx.data<T>();
  zero<T>(dx);
  for_each_output(DY, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const int64_t h0 = bin_start(oh, DX.H, DY.H), h1 = bin_end(oh, DX.H, DY.H);
    const int64_t w0 = bin_start(ow, DX.W, DY.W), w1 = bin_end(ow, DX.W, DY.W);
    const T g = static_cast<T>(double(pdy[DY.at(n, c, oh, ow)]) / double((h1 - h0) * (w1 - w0)));
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) pdx[DX.at(n, c, h, w)] += g;
  });
}

}  // namespace

void ReferenceBackend::max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  dispatch_float(x.dtype(), "max_pool2d", [&](auto tag) { max_pool2d_kernel<decltype(tag)>(x, y, indices, p); });
}

void ReferenceBackend::max_pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& indices, const Tensor& dy,
                                           const Tensor& dx, const Pool2dParams& p) {
  dispatch_float(dx.dtype(), "max_pool2d_backward",
                 [&](auto tag) { max_pool2d_backward_kernel<decltype(tag)>(x, y, indices, dy, dx, p); });
}

void ReferenceBackend::avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  dispatch_float(x.dtype(), "avg_pool2d", [&](auto tag) { avg_pool2d_kernel<decltype(tag)>(x, y, p); });
}

void ReferenceBackend::avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  dispatch_float(dy.dtype(), "avg_pool2d_backward",
                 [&](auto tag) { avg_pool2d_backward_kernel<decltype(tag)>(dy, dx, p); });
}

void ReferenceBackend::adaptive_avg_pool2d(const Tensor& x, const Tensor& y) {
  dispatch_float(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) { adaptive_avg_pool2d_kernel<decltype(tag)>(x, y); });
}

void ReferenceBackend::adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx) {
  dispatch_float(dy.dtype(), "adaptive_avg_pool2d_backward",
                 [&](auto tag) { adaptive_avg_pool2d_backward_kernel<decltype(tag)>(dy, dx); });
}

}  // namespace duet
