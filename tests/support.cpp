#include "tests/test_support.h"
#include "opcheck/op_check.h"
#include <cmath>
#include <cstdlib>
#include <filesystem>

namespace duet::testing {

std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                      double eps, double atol, double rtol) {
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  for (const Tensor& t : inputs) {
    if (!t.defined()) continue;
    if (t.dtype() != DType::f64) return "gradcheck needs f64 inputs";
    if (!t.is_leaf() || !t.is_contiguous()) return "gradcheck needs contiguous leaf inputs";
  }
  Tensor out0;
  {
    NoGradGuard ng;
    out0 = f(inputs);
  }
  const Tensor R = random_tensor(out0.shape(), 1234, DType::f64);
  auto objective = [&]() {
    NoGradGuard ng;
    return sum(mul(f(inputs), R)).item();
  };
  for (const Tensor& t : inputs)
    if (t.defined()) t.zero_grad();
  Tensor loss = sum(mul(f(inputs), R));
  loss.backward();

  std::string worst;
  double worst_ratio = 1.0;
  for (size_t k = 0; k < inputs.size(); ++k) {
    const Tensor& t = inputs[k];
    if (!t.defined() || !t.requires_grad()) continue;
    const Tensor g = t.grad();
    if (!g.defined()) return fmt::format("input {} got no gradient", k);
    const std::vector<double> analytic = g.to_vector<double>();
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double saved = p[i];
      p[i] = saved + eps;
      const double fp = objective();
      p[i] = saved - eps;
      const double fm = objective();
      p[i] = saved;
      const double numeric = (fp - fm) / (2 * eps);
      const double ratio = std::abs(numeric - analytic[i]) / (atol + rtol * std::abs(numeric));
      if (ratio > worst_ratio || std::isnan(analytic[i])) {
        worst_ratio = std::isnan(analytic[i]) ? 1e300 : ratio;
        worst = fmt::format("input {} element {}: analytic {:.10g} vs numeric {:.10g}", k, i, analytic[i], numeric);
      }
    }
  }
  return worst;
}

double closeness(const Tensor& a, const Tensor& b, double atol, double rtol) { return opcheck::closeness(a, b, atol, rtol); }

::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape())
    return ::testing::AssertionFailure() << "shapes differ: " << shape_str(a.shape()) << " vs " << shape_str(b.shape());
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  for (size_t i = 0; i < va.size(); ++i) {
    const bool nan_mismatch = std::isnan(va[i]) != std::isnan(vb[i]);
    if (nan_mismatch || std::abs(va[i] - vb[i]) > atol + rtol * std::abs(vb[i]))
      return ::testing::AssertionFailure() << "element " << i << " of " << shape_str(a.shape()) << ": " << va[i]
                                           << " vs " << vb[i] << " (atol " << atol << ", rtol " << rtol << ")";
  }
  return ::testing::AssertionSuccess();
}

Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype, double lo, double hi) {
  return opcheck::random_values(shape, seed, dtype, lo, hi);
}

std::vector<Backend> cpu_backends() {
  std::vector<Backend> r{Backend::reference};
  if (backend_available(Backend::cpu)) r.push_back(Backend::cpu);
  return r;
}

std::string cpu_bf16_convolutions_not_native() {
  if (!backend_available(Backend::cpu)) return "the cpu backend is not built into this binary";
  const DTypeSupport s = backend(Backend::cpu).support(OpId::conv2d, DType::bf16);
  if (s.coverage == Coverage::native) return "";
  return s.why.empty() ? "not native" : s.why;
}

std::vector<OpEvent> profiled_events(const std::function<void()>& run) {
  profiler::clear();
  profiler::enable(true);
  run();
  profiler::enable(false);
  std::vector<OpEvent> events = profiler::collect();
  profiler::clear();
  return events;
}

std::string data_dir() {
  const char* env = std::getenv("DUET_DATA_DIR");
  if (env && *env && std::filesystem::is_directory(env)) return env;
  return "";
}

}  // namespace duet::testing
