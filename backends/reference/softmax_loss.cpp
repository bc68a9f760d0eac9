// Softmax, log-softmax and the cross-entropy loss on the host, forward and backward. Each line
// along the softmax dim (or each row of logits) is handled by scalar loops in double, always
// subtracting the line's maximum first so exp never overflows.
#include <algorithm>
#include <cmath>
#include <limits>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

// Calls f(offsets...) with the offset of the first element of every line along dim in each of
// the tensors, which share a shape. A 0-d tensor is one line of length 1.
template <class F, class... Ts>
void for_each_line(int64_t dim, F f, const Tensor& first, const Ts&... rest) {
  auto outer = [&](const Shape& s) { return first.dim() == 0 ? Shape{} : drop_dim(s, dim); };
  for_each_offset<1 + sizeof...(Ts)>(outer(first.shape()), {outer(first.strides()), outer(rest.strides())...}, f);
}

int64_t line_length(const Tensor& t, int64_t dim) { return t.dim() == 0 ? 1 : t.size(dim); }
int64_t line_stride(const Tensor& t, int64_t dim) { return t.dim() == 0 ? 0 : t.stride(dim); }

// The log-sum-exp of a strided line, computed as max + log(sum(exp(x - max))).
template <class T>
double log_sum_exp(const T* x, int64_t len, int64_t stride) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < len; ++i) mx = std::max(mx, double(widen(x[i * stride])));
  double sum = 0.0;
  for (int64_t i = 0; i < len; ++i) sum += std::exp(double(widen(x[i * stride])) - mx);
  return mx + std::log(sum);
}

// softmax(x)_i = exp(x_i - lse), log_softmax(x)_i = x_i - lse, where lse = log(sum_j exp(x_j)).
template <class T>
void softmax_kernel(const Tensor& x, const Tensor& y, int64_t dim, bool log) {
  const int64_t len = line_length(x, dim), sx = line_stride(x, dim), sy = line_stride(y, dim);
  const T* px = ptr<T>(x);
  T* py = ptr<T>(y);
  for_each_line(dim, [&](int64_t ox, int64_t oy) {
    const T* xl = px + ox;
    T* yl = py + oy;
    const double lse = log_sum_exp(xl, len, sx);
    for (int64_t i = 0; i < len; ++i) {
      const double z = double(widen(xl[i * sx])) - lse;
      yl[i * sy] = narrow<T>(log ? z : std::exp(z));
    }
  }, x, y);
}

// Given the forward output y:
//   softmax:     dx = y * (dy - sum(dy * y))
//   log_softmax: dx = dy - exp(y) * sum(dy)
template <class T>
void softmax_backward_kernel(const Tensor& y, const Tensor& dy, const Tensor& dx, int64_t dim, bool log) {
  const int64_t len = line_length(y, dim), sy = line_stride(y, dim), sdy = line_stride(dy, dim),
                sdx = line_stride(dx, dim);
  const T* py = ptr<T>(y);
  const T* pdy = ptr<T>(dy);
  T* pdx = ptr<T>(dx);
  for_each_line(dim, [&](int64_t oy, int64_t ody, int64_t odx) {
    const T* yl = py + oy;
    const T* dyl = pdy + ody;
    T* dxl = pdx + odx;
    double s = 0.0;
    for (int64_t i = 0; i < len; ++i) s += log ? double(widen(dyl[i * sdy])) : double(widen(dyl[i * sdy])) * widen(yl[i * sy]);
    for (int64_t i = 0; i < len; ++i) {
      const double yi = widen(yl[i * sy]), gi = widen(dyl[i * sdy]);
      dxl[i * sdx] = narrow<T>(log ? gi - std::exp(yi) * s : yi * (gi - s));
    }
  }, y, dy, dx);
}

void check_targets(const Tensor& target, int64_t C, const char* op) {
  const int64_t* t = target.data<int64_t>();
  const int64_t N = target.size(0), st = target.stride(0);
  for (int64_t i = 0; i < N; ++i)
    DUET_CHECK(t[i * st] >= 0 && t[i * st] < C, "{}: target[{}] = {} is not a valid class label, expected 0 <= label < {}",
               op, i, t[i * st], C);
}

// Per row, with logp = log_softmax(logits[i]) and label smoothing ls spreading ls over all C classes:
//   loss_i = -(1 - ls) * logp[t_i] - (ls / C) * sum_c logp[c],   loss = mean_i loss_i
template <class T>
void cross_entropy_kernel(const Tensor& logits, const Tensor& target, const Tensor& loss, double ls) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const int64_t sn = logits.stride(0), sc = logits.stride(1);
  check_targets(target, C, "cross_entropy");
  const T* px = logits.data<T>();
  const int64_t* pt = target.data<int64_t>();
  double total = 0.0;
  for (int64_t i = 0; i < N; ++i) {
    const T* row = px + i * sn;
    const double lse = log_sum_exp(row, C, sc);
    double sum_logp = 0.0;
    for (int64_t c = 0; c < C; ++c) sum_logp += double(row[c * sc]) - lse;
    const double logp_t = double(row[pt[i * target.stride(0)] * sc]) - lse;
    total += -(1.0 - ls) * logp_t - (ls / double(C)) * sum_logp;
  }
  loss.data<T>()[0] = static_cast<T>(total / double(N));  // N == 0 gives NaN, as PyTorch's mean does
}

// d loss / d logits[i, c] = dloss / N * (softmax(logits[i])[c] - (1 - ls) * [c == t_i] - ls / C)
template <class T>
void cross_entropy_backward_kernel(const Tensor& logits, const Tensor& target, const Tensor& dloss,
                                   const Tensor& dlogits, double ls) {
  const int64_t N = logits.size(0), C = logits.size(1);
  const int64_t sn = logits.stride(0), sc = logits.stride(1);
  const int64_t dsn = dlogits.stride(0), dsc = dlogits.stride(1);
  check_targets(target, C, "cross_entropy_backward");
  const T* px = logits.data<T>();
  const int64_t* pt = target.data<int64_t>();
  T* pd = dlogits.data<T>();
  const double scale = double(dloss.data<T>()[0]) / double(N);
  for (int64_t i = 0; i < N; ++i) {
    const T* row = px + i * sn;
    const int64_t t = pt[i * target.stride(0)];
    const double lse = log_sum_exp(row, C, sc);
    for (int64_t c = 0; c < C; ++c) {
      const double p = std::exp(double(row[c * sc]) - lse);
      const double onehot = c == t ? 1.0 - ls : 0.0;
      pd[i * dsn + c * dsc] = static_cast<T>(scale * (p - onehot - ls / double(C)));
    }
  }
}

}  // namespace

void ReferenceBackend::softmax(const Tensor& x, const Tensor& y, int64_t dim, bool log) {
  dispatch_float_or_half(x.dtype(), log ? "log_softmax" : "softmax",
                 [&](auto tag) { softmax_kernel<decltype(tag)>(x, y, dim, log); });
}

void ReferenceBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, int64_t dim, bool log) {
  dispatch_float_or_half(y.dtype(), log ? "log_softmax_backward" : "softmax_backward",
                 [&](auto tag) { softmax_backward_kernel<decltype(tag)>(y, dy, dx, dim, log); });
}

void ReferenceBackend::cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss,
                                     double label_smoothing) {
  dispatch_float(logits.dtype(), "cross_entropy",
                 [&](auto tag) { cross_entropy_kernel<decltype(tag)>(logits, target, loss, label_smoothing); });
}

void ReferenceBackend::cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& dloss,
                                              const Tensor& dlogits, double label_smoothing) {
  dispatch_float(logits.dtype(), "cross_entropy_backward", [&](auto tag) {
    cross_entropy_backward_kernel<decltype(tag)>(logits, target, dloss, dlogits, label_smoothing);
  });
}

}  // namespace duet
