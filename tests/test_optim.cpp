// Optimizers against PyTorch's update rules, written out as scalar formulas, on every CPU backend.
// The objective is a fixed quadratic f(w) = sum(a * w^2 / 2 - b * w), whose gradient a * w - b
// the test recomputes by hand at every step.
#include <cmath>
#include "engine/optim/optimizer.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::all_close;

namespace {
const std::vector<double> kA{0.5, 1.0, 2.0, 3.0, 0.25, 1.5};
const std::vector<double> kB{1.0, -2.0, 0.5, 0.0, 3.0, -1.0};
const std::vector<double> kW0{0.3, -0.7, 1.2, -1.5, 0.05, 2.0};

Tensor param(DType dt) { return Tensor::from_vector(kW0, {2, 3}, TensorOptions(dt).with_grad(true)); }

// Sets w.grad through autograd, as training does.
void backward_quadratic(const Tensor& w) {
  const TensorOptions o = TensorOptions(w.dtype());
  const Tensor a = Tensor::from_vector(kA, {2, 3}, o), b = Tensor::from_vector(kB, {2, 3}, o);
  const Tensor f = sub(mul(sum(mul(a, square(w))), 0.5), sum(mul(b, w)));
  f.backward();
}

std::vector<double> grad_at(const std::vector<double>& w) {
  std::vector<double> g(w.size());
  for (size_t i = 0; i < w.size(); ++i) g[i] = kA[i] * w[i] - kB[i];
  return g;
}

struct SgdCase {
  double lr, momentum, dampening, weight_decay;
  bool nesterov;
};

// torch.optim.SGD, element by element.
std::vector<double> sgd_expected(const SgdCase& c, int steps) {
  std::vector<double> w = kW0, buf(w.size(), 0.0);
  for (int t = 0; t < steps; ++t) {
    const std::vector<double> grad = grad_at(w);
    for (size_t i = 0; i < w.size(); ++i) {
      double d = grad[i] + c.weight_decay * w[i];
      if (c.momentum != 0) {
        buf[i] = t == 0 ? d : c.momentum * buf[i] + (1 - c.dampening) * d;
        d = c.nesterov ? d + c.momentum * buf[i] : buf[i];
      }
      w[i] -= c.lr * d;
    }
  }
  return w;
}

struct AdamCase {
  double lr, beta1, beta2, eps, weight_decay;
  bool decoupled;
};

// torch.optim.Adam / AdamW, element by element, with the bias-corrected moments.
std::vector<double> adam_expected(const AdamCase& c, int steps) {
  std::vector<double> w = kW0, m(w.size(), 0.0), v(w.size(), 0.0);
  for (int t = 1; t <= steps; ++t) {
    const std::vector<double> grad = grad_at(w);
    for (size_t i = 0; i < w.size(); ++i) {
      double g = grad[i];
      if (c.decoupled) w[i] *= 1 - c.lr * c.weight_decay;
      else g += c.weight_decay * w[i];
      m[i] = c.beta1 * m[i] + (1 - c.beta1) * g;
      v[i] = c.beta2 * v[i] + (1 - c.beta2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(c.beta1, t));
      const double v_hat = v[i] / (1 - std::pow(c.beta2, t));
      w[i] -= c.lr * m_hat / (std::sqrt(v_hat) + c.eps);
    }
  }
  return w;
}

Tensor expected_tensor(const std::vector<double>& w) { return Tensor::from_vector(w, {2, 3}, DType::f64); }

void run_steps(optim::Optimizer& opt, const Tensor& w, int steps) {
  for (int t = 0; t < steps; ++t) {
    opt.zero_grad();
    backward_quadratic(w);
    opt.step();
  }
}

class OptimOnBackend : public ::testing::TestWithParam<Backend> {
protected:
  void SetUp() override { guard_ = std::make_unique<BackendGuard>(DeviceType::cpu, GetParam()); }
  void TearDown() override { guard_.reset(); }
  std::unique_ptr<BackendGuard> guard_;
};
}  // namespace

TEST_P(OptimOnBackend, SgdMatchesTorchFormulas) {
  const std::vector<SgdCase> cases{
      {0.1, 0.0, 0.0, 0.0, false},   // plain
      {0.1, 0.9, 0.0, 0.0, false},   // momentum (first step: buf = grad)
      {0.05, 0.9, 0.0, 0.0, true},   // Nesterov
      {0.1, 0.8, 0.3, 0.0, false},   // dampening
      {0.1, 0.9, 0.0, 0.05, false},  // weight decay folded into the gradient
      {0.05, 0.9, 0.0, 0.01, true},  // all of them
  };
  const int steps = 5;
  for (DType dt : {DType::f32, DType::f64}) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const SgdCase& c = cases[k];
      const Tensor w = param(dt);
      optim::SGD opt({w}, {.lr = c.lr, .momentum = c.momentum, .dampening = c.dampening,
                           .weight_decay = c.weight_decay, .nesterov = c.nesterov});
      run_steps(opt, w, steps);
      const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
      EXPECT_TRUE(all_close(w, expected_tensor(sgd_expected(c, steps)), tol, tol))
          << "case " << k << " dtype " << dtype_name(dt);
      EXPECT_EQ(opt.steps(), steps);
    }
  }
}

TEST_P(OptimOnBackend, AdamAndAdamWMatchTorchFormulas) {
  const std::vector<AdamCase> cases{
      {0.1, 0.9, 0.999, 1e-8, 0.0, false},
      {0.05, 0.8, 0.99, 1e-6, 0.1, false},  // Adam: L2 decay in the gradient
      {0.05, 0.8, 0.99, 1e-6, 0.1, true},   // AdamW: decoupled decay
      {0.01, 0.9, 0.999, 1e-8, 0.01, true},
  };
  const int steps = 6;
  for (DType dt : {DType::f32, DType::f64}) {
    for (size_t k = 0; k < cases.size(); ++k) {
      const AdamCase& c = cases[k];
      const Tensor w = param(dt);
      std::unique_ptr<optim::Optimizer> opt;
      if (c.decoupled)
        opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{w},
                                             optim::AdamWOptions{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay});
      else
        opt = std::make_unique<optim::Adam>(std::vector<Tensor>{w},
                                            optim::AdamOptions{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay});
      EXPECT_EQ(opt->name(), c.decoupled ? "adamw" : "adam");
      run_steps(*opt, w, steps);
      const double tol = dt == DType::f32 ? 2e-5 : 1e-12;
      EXPECT_TRUE(all_close(w, expected_tensor(adam_expected(c, steps)), tol, tol))
          << "case " << k << " dtype " << dtype_name(dt);
    }
  }
}

TEST_P(OptimOnBackend, SkipsParametersWithoutGradient) {
  const Tensor w = param(DType::f32), idle = param(DType::f32);
  optim::Adam opt({w, idle}, {.lr = 0.1});
  run_steps(opt, w, 3);
  EXPECT_TRUE(all_close(idle, param(DType::f32), 0, 0));
  EXPECT_FALSE(all_close(w, param(DType::f32), 0, 0));
  // Only the updated parameter has state.
  const auto state = opt.state_tensors();
  for (const auto& [n, t] : state) EXPECT_FALSE(n.starts_with("state.1.")) << n;
}

INSTANTIATE_TEST_SUITE_P(Backends, OptimOnBackend, ::testing::ValuesIn(duet::testing::cpu_backends()),
                         [](const ::testing::TestParamInfo<Backend>& i) { return std::string(backend_name(i.param)); });

TEST(Optim, ParamGroupsHaveTheirOwnLearningRate) {
  const Tensor w1 = param(DType::f64), w2 = param(DType::f64);
  optim::ParamGroup g1{.params = {w1}, .lr = 0.1}, g2{.params = {w2}, .lr = 0.01};
  optim::SGD opt({g1, g2});
  opt.zero_grad();
  backward_quadratic(w1);
  backward_quadratic(w2);
  opt.step();
  EXPECT_TRUE(all_close(w1, expected_tensor(sgd_expected({0.1, 0, 0, 0, false}, 1)), 1e-12, 1e-12));
  EXPECT_TRUE(all_close(w2, expected_tensor(sgd_expected({0.01, 0, 0, 0, false}, 1)), 1e-12, 1e-12));
  EXPECT_DOUBLE_EQ(opt.lr(), 0.1);
  opt.set_lr(0.5);
  EXPECT_DOUBLE_EQ(opt.param_groups()[1].lr, 0.5);
  opt.zero_grad();
  EXPECT_FALSE(w1.grad().defined());
}

TEST(Optim, StateIsOptimizerMemoryAndRoundTrips) {
  const auto state_bytes = [] {
    return cpu_allocator().stats().by_tag[static_cast<int>(MemTag::optimizer_state)];
  };
  const Tensor w = param(DType::f32);
  optim::Adam opt({w}, {.lr = 0.05});
  const int64_t before = state_bytes();
  run_steps(opt, w, 3);
  EXPECT_EQ(state_bytes() - before, 2 * 6 * 4);  // exp_avg and exp_avg_sq
  EXPECT_EQ(opt.state_bytes(), 48);

  const auto state = opt.state_tensors();
  std::vector<std::string> names;
  for (const auto& [n, t] : state) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"state.0.exp_avg", "state.0.exp_avg_sq", "state.0.step", "steps"}));

  // A fresh optimizer on a copy of the weights, loaded from the state, continues identically.
  const Tensor w2 = w.detach().clone().set_requires_grad(true);
  optim::Adam resumed({w2}, {.lr = 0.05});
  resumed.load_state_tensors(state);
  EXPECT_EQ(resumed.steps(), 3);
  run_steps(opt, w, 2);
  run_steps(resumed, w2, 2);
  EXPECT_TRUE(all_close(w2, w, 0, 0));

  EXPECT_THROW(resumed.load_state_tensors({{"state.0.momentum_buffer", Tensor::zeros({2, 3})}}), Error);
  EXPECT_THROW(resumed.load_state_tensors({{"state.0.exp_avg", Tensor::zeros({3})}}), Error);
  EXPECT_THROW(resumed.load_state_tensors({{"state.5.exp_avg", Tensor::zeros({2, 3})}}), Error);
  EXPECT_THROW(resumed.load_state_tensors({{"bogus", Tensor::zeros({2, 3})}}), Error);

  // SGD: a loaded momentum buffer means the next step is not a first step.
  const Tensor s1 = param(DType::f64), s2 = param(DType::f64);
  optim::SGD a({s1}, {.lr = 0.1, .momentum = 0.9});
  run_steps(a, s1, 2);
  optim::SGD b({s2}, {.lr = 0.1, .momentum = 0.9});
  s2.copy_(s1);
  b.load_state_tensors(a.state_tensors());
  run_steps(a, s1, 1);
  run_steps(b, s2, 1);
  EXPECT_TRUE(all_close(s2, s1, 0, 0));
  EXPECT_TRUE(all_close(s1, expected_tensor(sgd_expected({0.1, 0.9, 0, 0, false}, 3)), 1e-12, 1e-12));
}

// The fused updates walk memory: a gradient or state laid out otherwise than its parameter is
// named, not silently mixed up (the optimizer itself brings them to the parameter's layout).
TEST(Optim, UpdatesNeedTheParametersLayout) {
  const Tensor w = duet::testing::random_tensor({4, 3, 2, 2}, 5, DType::f32, -1.0, 1.0).contiguous(MemoryFormat::channels_last);
  const Tensor nchw_grad = Tensor::ones({4, 3, 2, 2});
  EXPECT_ERROR_HAS(sgd_step_(w, nchw_grad, Tensor(), {.lr = 0.1}, true), "'grad' has shape [4, 3, 2, 2] and strides",
                   "expected the param's shape [4, 3, 2, 2] and strides [12, 1, 6, 3]");
  EXPECT_ERROR_HAS(sgd_step_(w.slice(1, 0, 2), Tensor::ones({4, 2, 2, 2}), Tensor(), {.lr = 0.1}, true), "expected a dense tensor");
  // The same values in the parameter's layout: the step goes through, element for element.
  const std::vector<float> before = w.to_vector<float>();
  sgd_step_(w, nchw_grad.contiguous(MemoryFormat::channels_last), Tensor(), {.lr = 0.5}, true);
  const std::vector<float> after = w.to_vector<float>();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f);
}

TEST(Optim, RejectsBadConfigurations) {
  const Tensor w = param(DType::f32);
  EXPECT_THROW(optim::SGD({w}, {.lr = 0.1, .momentum = 0.0, .nesterov = true}), Error);
  EXPECT_THROW(optim::SGD({w}, {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}), Error);
  EXPECT_THROW(optim::SGD({w, w}, {.lr = 0.1}), Error);
  EXPECT_THROW(optim::SGD({w}, {.lr = -1}), Error);
  EXPECT_THROW(optim::Adam({w}, {.beta1 = 1.0}), Error);
  EXPECT_THROW(optim::Adam({mul(w, 2.0)}, {}), Error);
  EXPECT_THROW(optim::SGD({Tensor()}, {}), Error);
  optim::SGD ok({w}, {.lr = 0.1});
  EXPECT_THROW(ok.set_lr(std::nan("")), Error);
}
