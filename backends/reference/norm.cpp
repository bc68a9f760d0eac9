// Normalisation layers on the host: batch norm (per channel over N, H, W) and layer norm (per row
// over the last dim), forward and backward. Statistics use two passes (mean, then centred squares)
// in double, which is the numerically safe textbook form; the loops are plain scalar code.
#include <cmath>
#include <vector>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

// Calls f(n, h, w) for every position of channel c: the set batch norm reduces over.
template <class F>
void for_each_in_channel(const View4& v, F f) {
  for (int64_t n = 0; n < v.N; ++n)
    for (int64_t h = 0; h < v.H; ++h)
      for (int64_t w = 0; w < v.W; ++w) f(n, h, w);
}

// The dtype of batch norm's parameters and statistics for data of type T: f32 for 16-bit data.
template <class T>
using param_t = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

// Element c of a 1-D per-channel tensor.
template <class T>
T& at1(const Tensor& t, int64_t c) { return t.data<T>()[c * t.stride(0)]; }

template <class T, class P = param_t<T>>
void batch_norm_kernel(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                       const Tensor& running_var, const Tensor& y, const Tensor& save_mean,
                       const Tensor& save_invstd, const BatchNormParams& p) {
  const View4 X(x), Y(y);
  const T* px = ptr<T>(x);
  T* py = ptr<T>(y);
  const int64_t count = X.N * X.H * X.W;
  DUET_CHECK(p.training || (running_mean.defined() && running_var.defined()),
             "batch_norm on backend 'reference': evaluation mode needs running_mean and running_var");
  for (int64_t c = 0; c < X.C; ++c) {
    double mean, var;
    if (p.training) {
      double sum = 0.0;
      for_each_in_channel(X, [&](int64_t n, int64_t h, int64_t w) { sum += widen(px[X.at(n, c, h, w)]); });
      mean = sum / double(count);
      double sq = 0.0;
      for_each_in_channel(X, [&](int64_t n, int64_t h, int64_t w) {
        const double d = widen(px[X.at(n, c, h, w)]) - mean;
        sq += d * d;
      });
      var = sq / double(count);  // biased: the variance the batch is normalised with
    } else {
      mean = at1<P>(running_mean, c);
      var = at1<P>(running_var, c);
    }
    const double invstd = inv_std(var, p.eps);
    // y = (x - mean) * invstd * gamma + beta, folded into one multiply-add per element.
    const double scale = invstd * double(at1<P>(gamma, c));
    const double shift = double(at1<P>(beta, c)) - mean * scale;
    for_each_in_channel(X, [&](int64_t n, int64_t h, int64_t w) {
      py[Y.at(n, c, h, w)] = narrow<T>(double(widen(px[X.at(n, c, h, w)])) * scale + shift);
    });
    if (save_mean.defined()) at1<P>(save_mean, c) = static_cast<P>(mean);
    if (save_invstd.defined()) at1<P>(save_invstd, c) = static_cast<P>(invstd);
    if (p.training && running_mean.defined() && running_var.defined()) {
      P& rm = at1<P>(running_mean, c);
      P& rv = at1<P>(running_var, c);
      rm = static_cast<P>(running_update(double(rm), mean, p.momentum));
      rv = static_cast<P>(running_update(double(rv), unbiased_var(var, count), p.momentum));
    }
  }
}

// With xhat = (x - mean) * invstd and m = N*H*W, differentiating through the batch statistics gives
//   dx = gamma * invstd / m * (m * dy - sum(dy) - xhat * sum(dy * xhat))
//   dgamma = sum(dy * xhat),  dbeta = sum(dy)
template <class T, class P = param_t<T>>
void batch_norm_backward_kernel(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& save_mean,
                                const Tensor& save_invstd, const Tensor& dx, const Tensor& dgamma,
                                const Tensor& dbeta) {
  const View4 X(x), DY(dy);
  const T* px = ptr<T>(x);
  const T* pdy = ptr<T>(dy);
  const double count = double(X.N * X.H * X.W);
  for (int64_t c = 0; c < X.C; ++c) {
    const double mean = at1<P>(save_mean, c), invstd = at1<P>(save_invstd, c);
    double sum_dy = 0.0, sum_dy_xhat = 0.0;
    for_each_in_channel(X, [&](int64_t n, int64_t h, int64_t w) {
      const double g = widen(pdy[DY.at(n, c, h, w)]);
      sum_dy += g;
      sum_dy_xhat += g * (widen(px[X.at(n, c, h, w)]) - mean) * invstd;
    });
    if (dgamma.defined()) at1<P>(dgamma, c) = static_cast<P>(sum_dy_xhat);
    if (dbeta.defined()) at1<P>(dbeta, c) = static_cast<P>(sum_dy);
    if (!dx.defined()) continue;
    const View4 DX(dx);
    T* pdx = ptr<T>(dx);
    const double k = double(at1<P>(gamma, c)) * invstd / count;
    for_each_in_channel(X, [&](int64_t n, int64_t h, int64_t w) {
      const double xhat = (widen(px[X.at(n, c, h, w)]) - mean) * invstd;
      pdx[DX.at(n, c, h, w)] = narrow<T>(k * (count * widen(pdy[DY.at(n, c, h, w)]) - sum_dy - xhat * sum_dy_xhat));
    });
  }
}

// The leading dims of x index rows; rows are numbered in row-major order, which is how the
// per-row statistics mean/rstd (contiguous, numel = rows) are laid out.
Shape row_strides(const Tensor& t) { return drop_dim(t.strides(), t.dim() - 1); }

template <class T>
void layer_norm_kernel(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                       const Tensor& mean_out, const Tensor& rstd_out, double eps) {
  const int64_t last = x.dim() - 1, D = x.size(last);
  const int64_t sx = x.stride(last), sy = y.stride(last);
  const T* px = x.data<T>();
  T* py = y.data<T>();
  const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;
  const T* pb = beta.defined() ? beta.data<T>() : nullptr;
  const int64_t sg = gamma.defined() ? gamma.stride(0) : 0, sb = beta.defined() ? beta.stride(0) : 0;
  T* pmean = mean_out.defined() ? mean_out.data<T>() : nullptr;
  T* prstd = rstd_out.defined() ? rstd_out.data<T>() : nullptr;
  int64_t r = 0;
  for_each_offset<2>(drop_dim(x.shape(), last), {row_strides(x), row_strides(y)}, [&](int64_t ox, int64_t oy) {
    const T* xr = px + ox;
    T* yr = py + oy;
    double sum = 0.0;
    for (int64_t d = 0; d < D; ++d) sum += xr[d * sx];
    const double mean = sum / double(D);
    double sq = 0.0;
    for (int64_t d = 0; d < D; ++d) sq += (xr[d * sx] - mean) * (xr[d * sx] - mean);
    const double rstd = inv_std(sq / double(D), eps);  // biased variance, as PyTorch
    for (int64_t d = 0; d < D; ++d) {
      double v = (xr[d * sx] - mean) * rstd;
      if (pg) v *= pg[d * sg];
      if (pb) v += pb[d * sb];
      yr[d * sy] = static_cast<T>(v);
    }
    if (pmean) pmean[r] = static_cast<T>(mean);
    if (prstd) prstd[r] = static_cast<T>(rstd);
    ++r;
  });
}

// Per row, with xhat = (x - mean) * rstd and g = dy * gamma (or dy without gamma):
//   dx = rstd * (g - mean_d(g) - xhat * mean_d(g * xhat))
// and over rows: dgamma = sum(dy * xhat), dbeta = sum(dy).
template <class T>
void layer_norm_backward_kernel(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean_in,
                                const Tensor& rstd_in, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  const int64_t last = x.dim() - 1, D = x.size(last);
  const int64_t sx = x.stride(last), sdy = dy.stride(last);
  // When dx is not wanted its walk reuses x's strides; nothing is written through them.
  const Tensor& dx_or_x = dx.defined() ? dx : x;
  const int64_t sdx = dx_or_x.stride(last);
  const T* px = x.data<T>();
  const T* pdy = dy.data<T>();
  T* pdx = dx.defined() ? dx.data<T>() : nullptr;
  const T* pg = gamma.defined() ? gamma.data<T>() : nullptr;
  const int64_t sg = gamma.defined() ? gamma.stride(0) : 0;
  const T* pmean = mean_in.data<T>();
  const T* prstd = rstd_in.data<T>();
  std::vector<double> dgamma_acc(static_cast<size_t>(D), 0.0), dbeta_acc(static_cast<size_t>(D), 0.0);
  int64_t r = 0;
  for_each_offset<3>(drop_dim(x.shape(), last), {row_strides(x), row_strides(dy), row_strides(dx_or_x)},
                     [&](int64_t ox, int64_t ody, int64_t odx) {
    const T* xr = px + ox;
    const T* dyr = pdy + ody;
    const double mean = pmean[r], rstd = prstd[r];
    ++r;
    double sum_g = 0.0, sum_g_xhat = 0.0;
    for (int64_t d = 0; d < D; ++d) {
      const double xhat = (xr[d * sx] - mean) * rstd;
      const double g = pg ? double(dyr[d * sdy]) * pg[d * sg] : double(dyr[d * sdy]);
      sum_g += g;
      sum_g_xhat += g * xhat;
      dgamma_acc[d] += dyr[d * sdy] * xhat;
      dbeta_acc[d] += dyr[d * sdy];
    }
    if (!pdx) return;
    const double mean_g = sum_g / double(D), mean_g_xhat = sum_g_xhat / double(D);
    for (int64_t d = 0; d < D; ++d) {
      const double xhat = (xr[d * sx] - mean) * rstd;
      const double g = pg ? double(dyr[d * sdy]) * pg[d * sg] : double(dyr[d * sdy]);
      pdx[odx + d * sdx] = static_cast<T>(rstd * (g - mean_g - xhat * mean_g_xhat));
    }
  });
  if (dgamma.defined())
    for (int64_t d = 0; d < D; ++d) dgamma.data<T>()[d * dgamma.stride(0)] = static_cast<T>(dgamma_acc[d]);
  if (dbeta.defined())
    for (int64_t d = 0; d < D; ++d) dbeta.data<T>()[d * dbeta.stride(0)] = static_cast<T>(dbeta_acc[d]);
}

}  // namespace

void ReferenceBackend::batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                  const Tensor& running_mean, const Tensor& running_var, const Tensor& residual,
                                  const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd,
                                  const BatchNormParams& p) {
  dispatch_float_or_half(x.dtype(), "batch_norm", [&](auto tag) {
    batch_norm_kernel<decltype(tag)>(x, gamma, beta, running_mean, running_var, y, save_mean, save_invstd, p);
  });
  // The reference does not fuse: the residual add and the activation are passes of their own.
  if (residual.defined()) binary(BinaryOp::add, y, residual, y);
  if (p.act) activation(*p.act, 0.0, y, y);
}

void ReferenceBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                           const Tensor& /*beta*/, const Tensor& save_mean, const Tensor& save_invstd,
                                           const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta,
                                           double /*eps: in save_invstd*/, std::optional<Activation> act) {
  // The reference masks the gradient in a pass of its own (fuses_batch_norm_activation_backward).
  DUET_CHECK(!act, "batch_norm_backward on backend 'reference': a fused {} is not taken here; mask dy first",
             activation_name(*act));
  dispatch_float_or_half(x.dtype(), "batch_norm_backward", [&](auto tag) {
    batch_norm_backward_kernel<decltype(tag)>(dy, x, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  });
}

void ReferenceBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y,
                                  const Tensor& mean, const Tensor& rstd, double eps) {
  dispatch_float(x.dtype(), "layer_norm",
                 [&](auto tag) { layer_norm_kernel<decltype(tag)>(x, gamma, beta, y, mean, rstd, eps); });
}

void ReferenceBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                           const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                           const Tensor& dgamma, const Tensor& dbeta) {
  dispatch_float(x.dtype(), "layer_norm_backward", [&](auto tag) {
    layer_norm_backward_kernel<decltype(tag)>(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  });
}

}  // namespace duet
