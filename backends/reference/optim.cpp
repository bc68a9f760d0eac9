// Optimizer updates on the host: one in-place pass over a parameter and its state, element by
// element, in a flat loop the compiler may vectorise. The arithmetic follows PyTorch's
// single-tensor SGD and Adam/AdamW step by step, in the parameter's dtype as PyTorch does.
#include <cmath>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

// g = grad + wd * param
// with momentum: buf = first_step ? g : momentum * buf + (1 - dampening) * g
//                g = nesterov ? g + momentum * buf : buf
// param -= lr * g
template <class T>
void sgd_kernel(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                bool first_step) {
  T* w = param.data<T>();
  const T* dw = grad.data<T>();
  T* buf = p.momentum != 0.0 ? momentum_buf.data<T>() : nullptr;
  const T lr = T(p.lr), wd = T(p.weight_decay), mom = T(p.momentum), damp = T(1.0 - p.dampening);
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    T g = dw[i] + wd * w[i];
    if (buf) {
      buf[i] = first_step ? g : mom * buf[i] + damp * g;
      g = p.nesterov ? g + mom * buf[i] : buf[i];
    }
    w[i] -= lr * g;
  }
}

// Adam: g = grad + wd * param; AdamW instead decays the weight: param *= 1 - lr * wd.
// m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2
// param -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <class T>
void adam_kernel(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 const AdamParams& p) {
  T* w = param.data<T>();
  const T* dw = grad.data<T>();
  T* m = exp_avg.data<T>();
  T* v = exp_avg_sq.data<T>();
  // Bias corrections are scalars, computed in double as PyTorch computes them in Python floats.
  const double t = double(p.step);
  const double bc1 = 1.0 - std::pow(p.beta1, t), bc2 = 1.0 - std::pow(p.beta2, t);
  const T step_size = T(p.lr / bc1), bc2_sqrt = T(std::sqrt(bc2)), eps = T(p.eps);
  const T b1 = T(p.beta1), b2 = T(p.beta2), one_minus_b1 = T(1.0 - p.beta1), one_minus_b2 = T(1.0 - p.beta2);
  const T wd = T(p.weight_decay);
  const T decay = T(1.0 - p.lr * p.weight_decay);
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    T g = dw[i];
    if (p.decoupled) w[i] *= decay;
    else g += wd * w[i];
    m[i] = b1 * m[i] + one_minus_b1 * g;
    v[i] = b2 * v[i] + one_minus_b2 * g * g;
    w[i] -= step_size * m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps);
  }
}

}  // namespace

void ReferenceBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf,
                                const SgdParams& p, bool first_step) {
  dispatch_float(param.dtype(), "sgd_step",
                 [&](auto tag) { sgd_kernel<decltype(tag)>(param, grad, momentum_buf, p, first_step); });
}

void ReferenceBackend::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                 const Tensor& exp_avg_sq, const AdamParams& p) {
  dispatch_float(param.dtype(), "adam_step",
                 [&](auto tag) { adam_kernel<decltype(tag)>(param, grad, exp_avg, exp_avg_sq, p); });
}

}  // namespace duet
