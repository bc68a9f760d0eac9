// engine/scalar_math.h: the per-element formulas that the reference loops, the cpu backend's loops
// and the CUDA kernels all call, checked here on the host in every build (with or without CUDA)
// against the textbook definitions, finite differences and PyTorch's choices at the kinks.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <set>
#include <string>
#include "engine/error.h"
#include "engine/op_params.h"
#include "engine/scalar_math.h"

using namespace duet;

namespace {
template <class F>
double central_difference(F f, double x, double h = 1e-6) {
  return (f(x + h) - f(x - h)) / (2 * h);
}
}  // namespace

TEST(ScalarMath, ActivationsMatchDefinitions) {
  for (double x : {-7.0, -3.0, -2.5, -1.0, -0.1, 0.0, 0.3, 1.0, 2.9, 3.0, 4.0, 6.0, 8.0}) {
    EXPECT_DOUBLE_EQ(activation_value(Activation::relu, x), x > 0 ? x : 0.0);
    EXPECT_DOUBLE_EQ(activation_value(Activation::relu6, x), std::min(std::max(x, 0.0), 6.0));
    EXPECT_NEAR(activation_value(Activation::gelu_erf, x), 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))), 1e-15);
    EXPECT_NEAR(activation_value(Activation::gelu_tanh, x),
                0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x))), 1e-15);
    EXPECT_NEAR(activation_value(Activation::sigmoid, x), 1 / (1 + std::exp(-x)), 1e-15);
    EXPECT_NEAR(activation_value(Activation::silu, x), x / (1 + std::exp(-x)), 1e-15);
    EXPECT_NEAR(activation_value(Activation::hardswish, x), x * std::min(std::max(x + 3, 0.0), 6.0) / 6, 1e-15);
    EXPECT_DOUBLE_EQ(activation_value(Activation::leaky_relu, x, 0.1), x > 0 ? x : 0.1 * x);  // Darknet's slope
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(activation_value(Activation::relu, nan)));   // NaN passes, as in PyTorch
  EXPECT_TRUE(std::isnan(activation_value(Activation::relu6, nan)));
}

TEST(ScalarMath, DerivativesMatchFiniteDifferences) {
  for (Activation act : all_activations()) {
    const double alpha = activation_default_alpha(act);
    for (double x : {-4.2, -2.0, -0.7, 0.25, 1.3, 2.2, 5.1, 7.5}) {  // away from the kinks
      const double fd = central_difference([act, alpha](double v) { return activation_value(act, v, alpha); }, x);
      EXPECT_NEAR(activation_derivative(act, x, alpha), fd, 1e-6) << activation_name(act) << " at " << x;
    }
  }
  // PyTorch's choices at the kinks.
  EXPECT_EQ(activation_derivative(Activation::relu, 0.0), 0.0);
  EXPECT_EQ(activation_derivative(Activation::relu6, 6.0), 0.0);
  EXPECT_EQ(activation_derivative(Activation::hardswish, -3.0), -0.5);
  EXPECT_EQ(activation_derivative(Activation::hardswish, 3.0), 1.5);
  EXPECT_EQ(activation_derivative(Activation::hardswish, -3.5), 0.0);
  EXPECT_EQ(activation_derivative(Activation::leaky_relu, 0.0, 0.1), 0.1);  // leaky_relu_backward: x > 0 ? 1 : slope
  EXPECT_EQ(activation_derivative(Activation::leaky_relu, 2.0, 0.1), 1.0);
}

// The activation table is complete and consistent: every enumerator has a distinct op name, a
// backward name built from it, a module name and a cost; a code outside the enum is a duet::Error.
TEST(ScalarMath, EveryActivationHasItsNamesAndCost) {
  EXPECT_EQ(static_cast<int>(all_activations().size()), kNumActivations);
  std::set<std::string> names;
  for (Activation a : all_activations()) {
    const std::string n = activation_name(a);
    EXPECT_TRUE(names.insert(n).second) << n << " twice";
    EXPECT_EQ(std::string(activation_backward_name(a)), n + ".backward");
    EXPECT_FALSE(std::string(activation_module_name(a)).empty()) << n;
    EXPECT_GT(activation_flops(a), 0) << n;
  }
  EXPECT_THROW((void)activation_name(Activation::count), Error);
  EXPECT_THROW((void)activation_value(static_cast<Activation>(200), 1.0), Error);
}
