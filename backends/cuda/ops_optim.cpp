// SGD and Adam/AdamW reach the GPU as one fused kernel each (kernels_optim.cu): parameter,
// gradient and optimizer state are read and written once per step, in place. The kernels walk
// memory: the front-end (engine/ops/optim_kernels.cpp) has checked that all of them are dense
// with the parameter's strides.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace duet {
using namespace cuda;

void CudaBackend::sgd_step(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p,
                           bool first_step) {
  OpGuard g("sgd_step", param);
  check_on(g.op, "grad", grad, g.device());
  const bool momentum = p.momentum != 0.0;
  if (momentum) check_on(g.op, "momentum_buffer", momentum_buf, g.device());
  DUET_CUDA_CHECK(kern::sgd_step(param.dtype(), param.raw_data(), grad.raw_data(), momentum ? momentum_buf.raw_data() : nullptr,
                                 param.numel(), p, first_step, g.stream()),
                  g.op);
}

void CudaBackend::adam_step(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                            const AdamParams& p) {
  OpGuard g(p.decoupled ? "adamw_step" : "adam_step", param);
  check_on(g.op, "grad", grad, g.device());
  check_on(g.op, "exp_avg", exp_avg, g.device());
  check_on(g.op, "exp_avg_sq", exp_avg_sq, g.device());
  DUET_CUDA_CHECK(kern::adam_step(param.dtype(), param.raw_data(), grad.raw_data(), exp_avg.raw_data(), exp_avg_sq.raw_data(),
                                  param.numel(), p, g.stream()),
                  g.op);
}

}  // namespace duet
