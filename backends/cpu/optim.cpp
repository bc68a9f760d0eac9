// Optimizer updates on the cpu backend: one fused OpenMP pass per parameter reading param, grad
// and state once and writing them once (memory-bound, so the pass count is what matters). The
// arithmetic is the reference's, step for step, in the parameter's dtype.
#include <cmath>
#include "backends/cpu/common.h"

namespace duet {
using namespace cpu;

namespace {

template <class T>
void sgd_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                bool first_step) {
  T* w = param.data<T>();
  const T* dw = grad.data<T>();
  T* buf = p.momentum != 0.0 ? momentum_buf.data<T>() : nullptr;
  const T lr = T(p.lr), wd = T(p.weight_decay), mom = T(p.momentum), damp = T(1.0 - p.dampening);
  const bool nesterov = p.nesterov;
  parallel_for(param.numel(), param.numel() * 3, [&](int64_t b, int64_t e) {
    if (!buf) {
      for (int64_t i = b; i < e; ++i) w[i] -= lr * (dw[i] + wd * w[i]);
      return;
    }
    for (int64_t i = b; i < e; ++i) {
      T g = dw[i] + wd * w[i];
      buf[i] = first_step ? g : mom * buf[i] + damp * g;
      g = nesterov ? g + mom * buf[i] : buf[i];
      w[i] -= lr * g;
    }
  });
}

template <class T>
void adam_kernel(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamParams& p) {
  T* w = param.data<T>();
  const T* dw = grad.data<T>();
  T* m = exp_avg.data<T>();
  T* v = exp_avg_sq.data<T>();
  const double t = double(p.step);
  const double bc1 = 1.0 - std::pow(p.beta1, t), bc2 = 1.0 - std::pow(p.beta2, t);
  const T step_size = T(p.lr / bc1), bc2_sqrt = T(std::sqrt(bc2)), eps = T(p.eps);
  const T b1 = T(p.beta1), b2 = T(p.beta2), one_minus_b1 = T(1.0 - p.beta1), one_minus_b2 = T(1.0 - p.beta2);
  const T wd = T(p.weight_decay);
  const T decay = T(1.0 - p.lr * p.weight_decay);
  // Adam folds the decay into the gradient, AdamW into the weight; selecting the factors once
  // keeps the loop branch-free (x * 1 and g + 0 * w are exact for finite values).
  const T w_scale = p.decoupled ? decay : T(1), g_wd = p.decoupled ? T(0) : wd;
  parallel_for(param.numel(), param.numel() * 6, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T w0 = w[i];
      const T g = dw[i] + g_wd * w0;
      const T wi = w0 * w_scale;
      const T mi = b1 * m[i] + one_minus_b1 * g;
      const T vi = b2 * v[i] + one_minus_b2 * g * g;
      m[i] = mi;
      v[i] = vi;
      w[i] = wi - step_size * mi / (std::sqrt(vi) / bc2_sqrt + eps);
    }
  });
}

}  // namespace

void CpuBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                          bool first_step) {
  dispatch_float(param.dtype(), "sgd_step",
                 [&](auto tag) { sgd_kernel<decltype(tag)>(param, grad, momentum_buf, p, first_step); });
}

void CpuBackend::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                           const AdamParams& p) {
  dispatch_float(param.dtype(), "adam_step",
                 [&](auto tag) { adam_kernel<decltype(tag)>(param, grad, exp_avg, exp_avg_sq, p); });
}

}  // namespace duet
