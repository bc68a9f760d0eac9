// SGD and Adam/AdamW reach the GPU as one fused kernel each (kernels_optim.cu): parameter,
// gradient and optimizer state are read and written once per step, in place.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace duet {
using namespace cuda;

namespace {
// The kernels walk memory: element i of each tensor at the same offset (any dense layout, the
// same for all, e.g. channels-last weights with their gradients and state).
bool same_dense_layout(const Tensor& param, std::initializer_list<const Tensor*> others) {
  bool same = param.is_dense();
  for (const Tensor* t : others) same = same && t->strides() == param.strides();
  return same;
}
}  // namespace

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                           bool first_step) {
  OpGuard g("sgd_step", param);
  check_float(g.op, "param", param);
  check_on(g.op, "grad", grad, g.device());
  const bool momentum = p.momentum != 0.0;
  if (momentum) check_on(g.op, "momentum_buffer", momentum_buf, g.device());
  DUET_CHECK(same_dense_layout(param, {&grad, momentum ? &momentum_buf : &grad}),
             "sgd_step on backend 'cuda': param, grad and momentum buffer must be dense with the same strides");
  DUET_CUDA_CHECK(kern::sgd_step(param.dtype(), param.raw_data(), grad.raw_data(), momentum ? momentum_buf.raw_data() : nullptr,
                                 param.numel(), p, first_step, g.stream()),
                  g.op);
}

void CudaBackend::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                            const AdamParams& p) {
  OpGuard g(p.decoupled ? "adamw_step" : "adam_step", param);
  check_float(g.op, "param", param);
  check_on(g.op, "grad", grad, g.device());
  check_on(g.op, "exp_avg", exp_avg, g.device());
  check_on(g.op, "exp_avg_sq", exp_avg_sq, g.device());
  DUET_CHECK(same_dense_layout(param, {&grad, &exp_avg, &exp_avg_sq}),
             "{} on backend 'cuda': param, grad and state must be dense with the same strides", g.op);
  DUET_CUDA_CHECK(kern::adam_step(param.dtype(), param.raw_data(), grad.raw_data(), exp_avg.raw_data(), exp_avg_sq.raw_data(),
                                  param.numel(), p, g.stream()),
                  g.op);
}

}  // namespace duet
