// Attributes of the primitive ops: small value types shared by front-ends, backends and the
// profiler's cost formulas.
#pragma once
#include <cstdint>
#include <optional>
#include <vector>

namespace duet {

// Every op enum ends in `count`, the number of its ops: its name table is checked against it at
// compile time (op_params.cpp), and tests loop up to it.
enum class UnaryOp : uint8_t { neg, exp, log, sqrt, rsqrt, abs, tanh, square, count };
// Elementwise binary ops with broadcasting. eq/gt/lt give 1 or 0 in the input dtype.
enum class BinaryOp : uint8_t { add, sub, mul, div, maximum, minimum, eq, gt, lt, count };
// Tensor-scalar ops: out = x op s, or s op x for rsub/rdiv.
enum class ScalarOp : uint8_t { add, mul, pow, rsub, rdiv, maximum, minimum, count };
// Each activation's formulas, names and cost are in engine/scalar_math.h (ActivationFn); `count`
// is the number of activations, for loops over all of them (tests, benchmarks).
enum class Activation : uint8_t { relu, relu6, gelu_erf, gelu_tanh, sigmoid, silu, hardswish, leaky_relu, count };
constexpr int kNumActivations = static_cast<int>(Activation::count);
enum class ReduceOp : uint8_t { sum, mean, max, min, count };

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);
const char* scalar_op_name(ScalarOp op);
const char* activation_name(Activation a);           // the op's name in reports: "relu", "gelu", ...
const char* activation_module_name(Activation a);    // the nn module's: "ReLU", "GELU", ...
const char* activation_backward_name(Activation a);  // "relu.backward", ...
double activation_flops(Activation a);              // per element, for the roofline
double activation_default_alpha(Activation a);      // its parameter when none is given (0: none)
// Every activation, in enum order: what tests and benchmarks loop over.
std::vector<Activation> all_activations();
// Thrown for an activation code outside the enum (a corrupted value), naming it.
[[noreturn]] void bad_activation(Activation a);
const char* reduce_name(ReduceOp op);

struct Conv2dParams {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  // The epilogue fused into the same kernel or pass: y = act(conv(x) + bias [+ residual]), act none,
  // relu or relu6 (a frozen model's convolution with its batch norm folded in: nn::conv_bn).
  std::optional<Activation> act;
};

struct Pool2dParams {
  int64_t kernel_h = 2, kernel_w = 2;
  int64_t stride_h = 2, stride_w = 2;
  int64_t pad_h = 0, pad_w = 0;
  bool count_include_pad = true;  // average pooling only (PyTorch's default is true)
  bool ceil_mode = false;
};

struct BatchNormParams {
  bool training = true;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch (PyTorch's rule)
  double eps = 1e-5;
  // The activation applied in the normalisation pass itself: none, relu or relu6 (ResNet's and
  // MobileNetV2's). Both are masks of their output, so backward needs nothing but y (or, where the
  // backend recomputes the output, x and the statistics: fuses_batch_norm_activation_backward).
  std::optional<Activation> act;
};
// True for the activations batch_norm and conv2d can fuse (relu, relu6); the check throws, naming
// `who`, for any other (and costs a comparison otherwise: it runs on every batch norm call).
bool batch_norm_fuses(Activation a);
void check_fused_activation(const char* who, std::optional<Activation> act);
// The fused op's name in reports: "batch_norm", "batch_norm+relu6", "batch_norm+add+relu", ...
const char* batch_norm_name(bool residual, std::optional<Activation> act);
// The same for a convolution's epilogue (the same activations): "conv2d", "conv2d+add+relu", ...
const char* conv2d_name(bool residual, std::optional<Activation> act);
// The backward's profile label: "batch_norm.backward", or "batch_norm+relu.backward" where the
// activation's mask is applied inside it.
const char* batch_norm_backward_name(std::optional<Activation> act);

struct SgdParams {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

struct AdamParams {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled = false;  // true: AdamW (decay applied to the weight, not folded into the grad)
  int64_t step = 1;        // 1-based step, for bias correction
};

// Output size of a conv/pool window along one spatial dim; <= 0 means the window does not fit.
inline int64_t conv_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}
// The input position that output position o reads through kernel tap k along one spatial dim (outside
// [0, in) where the tap falls into the padding): the receptive-field formula, written once.
inline int64_t conv_in_index(int64_t o, int64_t k, int64_t s, int64_t p, int64_t d) { return o * s - p + k * d; }
int64_t pool_out_size(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode);

}  // namespace duet
