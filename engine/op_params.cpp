#include "engine/op_params.h"
#include <string>
#include "engine/error.h"
#include "engine/scalar_math.h"

namespace duet {

namespace {
// The name of op in its table, which must have one entry per enumerator before `count`.
template <class Op, size_t N>
const char* name_in(const char* const (&names)[N], Op op, const char* what) {
  static_assert(N == static_cast<size_t>(Op::count), "one name per op of the enum");
  const auto i = static_cast<size_t>(op);
  if (i >= N) throw Error(fmt::format("unknown {} op code {} (expected 0 to {})", what, i, N - 1));
  return names[i];
}
constexpr const char* kUnaryNames[] = {"neg", "exp", "log", "sqrt", "rsqrt", "abs", "tanh", "square"};
constexpr const char* kBinaryNames[] = {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "gt", "lt"};
constexpr const char* kScalarNames[] = {"add_scalar",  "mul_scalar",     "pow_scalar",    "rsub_scalar",
                                        "rdiv_scalar", "maximum_scalar", "minimum_scalar"};
constexpr const char* kReduceNames[] = {"sum", "mean", "amax", "amin"};
}  // namespace

const char* unary_name(UnaryOp op) { return name_in(kUnaryNames, op, "unary"); }
const char* binary_name(BinaryOp op) { return name_in(kBinaryNames, op, "binary"); }
const char* scalar_op_name(ScalarOp op) { return name_in(kScalarNames, op, "scalar"); }
const char* activation_name(Activation a) {
  return with_activation(a, [](auto fn) { return decltype(fn)::name; });
}
const char* activation_module_name(Activation a) {
  return with_activation(a, [](auto fn) { return decltype(fn)::module; });
}
const char* activation_backward_name(Activation a) {
  // Built once per activation from its name, so the two can never disagree.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (Activation x : all_activations()) n.push_back(std::string(activation_name(x)) + ".backward");
    return n;
  }();
  if (static_cast<int>(a) >= kNumActivations) bad_activation(a);
  return names[static_cast<size_t>(a)].c_str();
}
double activation_default_alpha(Activation a) {
  return with_activation(a, [](auto fn) { return decltype(fn)::default_alpha; });
}
double activation_flops(Activation a) {
  return with_activation(a, [](auto fn) { return decltype(fn)::flops; });
}
std::vector<Activation> all_activations() {
  std::vector<Activation> all;
  for (int i = 0; i < kNumActivations; ++i) all.push_back(static_cast<Activation>(i));
  return all;
}
void bad_activation(Activation a) {
  throw Error(fmt::format("unknown activation code {} (expected 0 to {})", static_cast<int>(a), kNumActivations - 1));
}
const char* reduce_name(ReduceOp op) { return name_in(kReduceNames, op, "reduce"); }

bool batch_norm_fuses(Activation a) { return a == Activation::relu || a == Activation::relu6; }
void check_fused_activation(const char* who, std::optional<Activation> act) {
  if (act && !batch_norm_fuses(*act))
    throw Error(fmt::format("{}: fused activation '{}' given, expected relu or relu6", who, activation_name(*act)));
}
namespace {
// A fused op's name by its epilogue: names[residual][none, relu, relu6].
using EpilogueNames = const char* const[2][3];
const char* epilogue_name(const char* op, EpilogueNames& names, bool residual, std::optional<Activation> act) {
  check_fused_activation(op, act);
  return names[residual][!act ? 0 : *act == Activation::relu ? 1 : 2];
}
}  // namespace
const char* batch_norm_name(bool residual, std::optional<Activation> act) {
  static constexpr EpilogueNames kNames = {{"batch_norm", "batch_norm+relu", "batch_norm+relu6"},
                                           {"batch_norm+add", "batch_norm+add+relu", "batch_norm+add+relu6"}};
  return epilogue_name("batch_norm", kNames, residual, act);
}
const char* conv2d_name(bool residual, std::optional<Activation> act) {
  static constexpr EpilogueNames kNames = {{"conv2d", "conv2d+relu", "conv2d+relu6"},
                                           {"conv2d+add", "conv2d+add+relu", "conv2d+add+relu6"}};
  return epilogue_name("conv2d", kNames, residual, act);
}

const char* batch_norm_backward_name(std::optional<Activation> act) {
  check_fused_activation("batch_norm_backward", act);
  if (!act) return "batch_norm.backward";
  return *act == Activation::relu ? "batch_norm+relu.backward" : "batch_norm+relu6.backward";
}

int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  const int64_t span = in + 2 * p - k;
  if (span < 0) return 0;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  // PyTorch's rule: with ceil_mode the last window must start inside the input or left padding.
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

}  // namespace duet
