// Front-ends of the fused optimizer updates: one kernel pass per parameter, in place, outside
// autograd, timed under the optimizer phase.
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
// The kernels update element i of every tensor at the same memory offset: the parameter dense
// (contiguous, channels-last or any other order without gaps), the gradient and state with its strides.
void check_param(const char* op, const Tensor& param) {
  check_float(op, "param", param);
  check_writable(op, param);
  DUET_CHECK(param.is_dense(), "{}: param has shape {} and strides {}, expected a dense tensor (no gaps or overlaps)", op,
             shape_str(param.shape()), shape_str(param.strides()));
}
void check_state(const char* op, const char* arg, const Tensor& t, const Tensor& param) {
  check_same(op, arg, t, "param", param);
  DUET_CHECK(t.shape() == param.shape() && t.strides() == param.strides(),
             "{}: '{}' has shape {} and strides {}, expected the param's shape {} and strides {}", op, arg,
             shape_str(t.shape()), shape_str(t.strides()), shape_str(param.shape()), shape_str(param.strides()));
}
}  // namespace

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p, bool first_step) {
  check_param("sgd_step", param);
  check_state("sgd_step", "grad", grad, param);
  if (p.momentum != 0.0) check_state("sgd_step", "momentum_buffer", momentum_buf, param);
  profiler::PhaseGuard phase(Phase::optimizer);
  Dispatch<OpId::sgd_step> kernel(backend_of(param), {&param});
  kernel(param, grad, momentum_buf, p, first_step);
}

void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamParams& p) {
  const char* name = p.decoupled ? "adamw_step" : "adam_step";
  check_param(name, param);
  check_state(name, "grad", grad, param);
  check_state(name, "exp_avg", exp_avg, param);
  check_state(name, "exp_avg_sq", exp_avg_sq, param);
  DUET_CHECK(p.step >= 1, "{}: step must be >= 1 (bias correction), got {}", name, p.step);
  profiler::PhaseGuard phase(Phase::optimizer);
  Dispatch<OpId::adam_step> kernel(backend_of(param), {&param});
  kernel(param, grad, exp_avg, exp_avg_sq, p);
}

}  // namespace duet
