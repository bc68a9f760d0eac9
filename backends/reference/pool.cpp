// 2-D pooling on the host: max, average and adaptive average, forward and backward. Each output
// element is computed from its window by direct loops, indexing through strides so NCHW and
// channels-last share the code. Backward passes zero dx and scatter into it, since windows overlap.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
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

// A backward pass's dx, accumulated in double over the overlapping windows and rounded to T once
// at the end (dx is dense, NCHW or channels-last, so its offsets are 0 .. numel-1).
template <class T>
class Scatter {
public:
  explicit Scatter(const Tensor& dx) : dx_(dx), acc_(static_cast<size_t>(dx.numel()), 0.0) {}
  void add(int64_t offset, double v) { acc_[static_cast<size_t>(offset)] += v; }
  ~Scatter() {
    T* p = ptr<T>(dx_);
    for (size_t i = 0; i < acc_.size(); ++i) p[i] = narrow<T>(acc_[i]);
  }

private:
  const Tensor& dx_;
  std::vector<double> acc_;
};

// Windows, divisors and adaptive bins are engine/scalar_math.h's, shared with the other backends.
// Every kernel takes T = float, double, Half or BFloat16 (16-bit values are widened to float).

// Padding acts as -infinity: only real input elements can win. A NaN wins over everything, as
// in PyTorch.
template <class T>
void max_pool2d_kernel(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  using W = decltype(widen(T{}));
  const View4 X(x), Y(y);
  const T* px = ptr<T>(x);
  T* py = ptr<T>(y);
  uint8_t* pi = indices.defined() ? indices.data<uint8_t>() : nullptr;
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
    W best = -std::numeric_limits<W>::infinity();
    int64_t bh = win.h0, bw = win.w0;  // the first position, should every value be -inf
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) {
        const W v = widen(px[X.at(n, c, h, w)]);
        if (v > best || (std::isnan(v) && !std::isnan(best))) best = v, bh = h, bw = w;
      }
    py[Y.at(n, c, oh, ow)] = narrow<T>(best);
    if (pi) pi[Y.at(n, c, oh, ow)] = static_cast<uint8_t>(window_offset(p, oh, ow, bh, bw));
  });
}

// The gradient of each output goes to the first window position (row-major) holding the maximum:
// the one the forward recorded, or, without indices, found again by comparing x with y.
template <class T>
void max_pool2d_backward_kernel(const Tensor& x, const Tensor& y, const Tensor& indices, const Tensor& dy,
                                const Tensor& dx, const Pool2dParams& p) {
  const View4 DY(dy), DX(dx);
  const T* pdy = ptr<T>(dy);
  Scatter<T> out(dx);
  if (indices.defined()) {
    const View4 I(indices);
    const uint8_t* pi = indices.data<uint8_t>();
    for_each_output(DY, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
      const WindowPos at = window_position(p, oh, ow, pi[I.at(n, c, oh, ow)]);
      out.add(DX.at(n, c, at.h, at.w), widen(pdy[DY.at(n, c, oh, ow)]));
    });
    return;
  }
  const View4 X(x), Y(y);
  const T* px = ptr<T>(x);
  const T* py = ptr<T>(y);
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
    const auto target = widen(py[Y.at(n, c, oh, ow)]);
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) {
        if (is_window_max(widen(px[X.at(n, c, h, w)]), target)) {
          out.add(DX.at(n, c, h, w), widen(pdy[DY.at(n, c, oh, ow)]));
          return;
        }
      }
  });
}

template <class T>
void avg_pool2d_kernel(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  const View4 X(x), Y(y);
  const T* px = ptr<T>(x);
  T* py = ptr<T>(y);
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, X.H, X.W);
    if (win.h0 >= win.h1 || win.w0 >= win.w1) {  // a window entirely in padding averages to 0
      py[Y.at(n, c, oh, ow)] = narrow<T>(0.0);
      return;
    }
    double sum = 0.0;
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) sum += widen(px[X.at(n, c, h, w)]);
    py[Y.at(n, c, oh, ow)] = narrow<T>(sum / double(avg_divisor(p, oh, ow, X.H, X.W)));
  });
}

template <class T>
void avg_pool2d_backward_kernel(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  const View4 DY(dy), DX(dx);
  const T* pdy = ptr<T>(dy);
  Scatter<T> out(dx);
  for_each_output(DY, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const PoolWindow win = pool_window(p, oh, ow, DX.H, DX.W);
    if (win.h0 >= win.h1 || win.w0 >= win.w1) return;
    const double g = double(widen(pdy[DY.at(n, c, oh, ow)])) / double(avg_divisor(p, oh, ow, DX.H, DX.W));
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) out.add(DX.at(n, c, h, w), g);
  });
}

template <class T>
void adaptive_avg_pool2d_kernel(const Tensor& x, const Tensor& y) {
  const View4 X(x), Y(y);
  const T* px = ptr<T>(x);
  T* py = ptr<T>(y);
  for_each_output(Y, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const int64_t h0 = bin_start(oh, X.H, Y.H), h1 = bin_end(oh, X.H, Y.H);
    const int64_t w0 = bin_start(ow, X.W, Y.W), w1 = bin_end(ow, X.W, Y.W);
    double sum = 0.0;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) sum += widen(px[X.at(n, c, h, w)]);
    py[Y.at(n, c, oh, ow)] = narrow<T>(sum / double((h1 - h0) * (w1 - w0)));
  });
}

template <class T>
void adaptive_avg_pool2d_backward_kernel(const Tensor& dy, const Tensor& dx) {
  const View4 DY(dy), DX(dx);
  const T* pdy = ptr<T>(dy);
  Scatter<T> out(dx);
  for_each_output(DY, [&](int64_t n, int64_t c, int64_t oh, int64_t ow) {
    const int64_t h0 = bin_start(oh, DX.H, DY.H), h1 = bin_end(oh, DX.H, DY.H);
    const int64_t w0 = bin_start(ow, DX.W, DY.W), w1 = bin_end(ow, DX.W, DY.W);
    const double g = double(widen(pdy[DY.at(n, c, oh, ow)])) / double((h1 - h0) * (w1 - w0));
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) out.add(DX.at(n, c, h, w), g);
  });
}

}  // namespace

void ReferenceBackend::max_pool2d(const Tensor& x, const Tensor& y, const Tensor& indices, const Pool2dParams& p) {
  dispatch_float_or_half(x.dtype(), "max_pool2d", [&](auto tag) { max_pool2d_kernel<decltype(tag)>(x, y, indices, p); });
}

void ReferenceBackend::max_pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& indices, const Tensor& dy,
                                           const Tensor& dx, const Pool2dParams& p) {
  dispatch_float_or_half(dx.dtype(), "max_pool2d_backward",
                 [&](auto tag) { max_pool2d_backward_kernel<decltype(tag)>(x, y, indices, dy, dx, p); });
}

void ReferenceBackend::avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  dispatch_float_or_half(x.dtype(), "avg_pool2d", [&](auto tag) { avg_pool2d_kernel<decltype(tag)>(x, y, p); });
}

void ReferenceBackend::avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  dispatch_float_or_half(dy.dtype(), "avg_pool2d_backward",
                 [&](auto tag) { avg_pool2d_backward_kernel<decltype(tag)>(dy, dx, p); });
}

void ReferenceBackend::adaptive_avg_pool2d(const Tensor& x, const Tensor& y) {
  dispatch_float_or_half(x.dtype(), "adaptive_avg_pool2d", [&](auto tag) { adaptive_avg_pool2d_kernel<decltype(tag)>(x, y); });
}

void ReferenceBackend::adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx) {
  dispatch_float_or_half(dy.dtype(), "adaptive_avg_pool2d_backward",
                 [&](auto tag) { adaptive_avg_pool2d_backward_kernel<decltype(tag)>(dy, dx); });
}

}  // namespace duet
