// engine/scalar_math.h: the per-element formulas that the reference loops, the cpu backend's loops
// and the CUDA kernels all call, checked here on the host in every build (with or without CUDA)
// against the textbook definitions, finite differences and PyTorch's choices at the kinks.
#include <gtest/gtest.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>
#include <random>
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

// ---- pooling windows (the reference, cpu and CUDA pooling all use these) ----------------------------
// Every op of the other op enums has one name (their tables are sized by `count` at compile
// time); a code past the enum is a clear error, not a read past the table.
TEST(ScalarMath, EveryOpOfEachEnumHasOneName) {
  const auto names_of = [](auto count, auto name) {
    std::set<std::string> names;
    for (int i = 0; i < static_cast<int>(count); ++i) names.insert(name(static_cast<decltype(count)>(i)));
    return names;
  };
  EXPECT_EQ(names_of(UnaryOp::count, unary_name).size(), static_cast<size_t>(UnaryOp::count));
  EXPECT_EQ(names_of(BinaryOp::count, binary_name).size(), static_cast<size_t>(BinaryOp::count));
  EXPECT_EQ(names_of(ScalarOp::count, scalar_op_name).size(), static_cast<size_t>(ScalarOp::count));
  EXPECT_EQ(names_of(ReduceOp::count, reduce_name).size(), static_cast<size_t>(ReduceOp::count));
  EXPECT_EQ(std::string(binary_name(BinaryOp::lt)), "lt");
  EXPECT_EQ(std::string(reduce_name(ReduceOp::max)), "amax");
  try {
    unary_name(UnaryOp::count);
    ADD_FAILURE() << "no error for a code past the enum";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown unary op code 8 (expected 0 to 7)"), std::string::npos) << e.what();
  }
}

TEST(ScalarMath, PoolingWindowsAndDivisors) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t k = 1 + rng() % 4, s = 1 + rng() % 3, p = rng() % (k / 2 + 1), in = k + rng() % 9;
    const bool ceil_mode = rng() % 2;
    const int64_t out = pool_out_size(in, k, s, p, ceil_mode);
    for (int64_t o = 0; o < out; ++o) {
      const int64_t start = o * s - p;
      // Divisors by counting: padded positions up to the padded border, or only real ones.
      int64_t with_pad = 0, real = 0;
      for (int64_t i = start; i < start + k; ++i) {
        with_pad += i < in + p;
        real += i >= 0 && i < in;
      }
      EXPECT_EQ(avg_divisor(o, 0, in, 1, k, 1, s, 1, p, 0, true), with_pad);
      EXPECT_EQ(avg_divisor(o, 0, in, 1, k, 1, s, 1, p, 0, false), real);
    }
    // windows_containing(i) is exactly the set of outputs whose window covers i.
    for (int64_t i = 0; i < in; ++i) {
      const PoolRange r = windows_containing(i, k, s, p, out);
      for (int64_t o = 0; o < out; ++o) {
        const bool covers = o * s - p <= i && i < o * s - p + k;
        EXPECT_EQ(covers, o >= r.begin && o <= r.end) << "i " << i << " o " << o << " k " << k << " s " << s << " p " << p;
      }
    }
  }
}

TEST(ScalarMath, AdaptiveBins) {
  for (int64_t n_in = 1; n_in <= 12; ++n_in)
    for (int64_t n_out = 1; n_out <= 12; ++n_out) {
      EXPECT_EQ(bin_start(0, n_in, n_out), 0);
      EXPECT_EQ(bin_end(n_out - 1, n_in, n_out), n_in);
      for (int64_t i = 0; i < n_in; ++i) {
        const PoolRange cand = bins_containing(i, n_in, n_out);
        int found = 0;
        for (int64_t o = 0; o < n_out; ++o) {
          const bool in_bin = bin_start(o, n_in, n_out) <= i && i < bin_end(o, n_in, n_out);
          if (in_bin) {
            ++found;
            EXPECT_TRUE(o >= cand.begin && o <= cand.end) << i << " in bin " << o << " of " << n_in << "->" << n_out;
          }
        }
        EXPECT_GE(found, 1);  // bins tile the input
      }
    }
}
