// The layers of engine/nn/layers.h with torch.nn's default initialisation and printing.
#include "engine/nn/layers.h"
#include <cmath>
#include "engine/allocator.h"
#include "engine/autograd.h"
#include "engine/nn/conv_bn.h"
#include "engine/profiler/events.h"

namespace duet::nn {

namespace {
std::string pair_str(int64_t a, int64_t b) { return fmt::format("({}, {})", a, b); }
const char* py_bool(bool b) { return b ? "True" : "False"; }

// Python's float repr for the values torch prints (1e-05, 0.1).
std::string py_float(double v) {
  std::string s = fmt::format("{}", v);
  const size_t e = s.find('e');
  if (e != std::string::npos && e + 2 < s.size() && s[e + 1] == '-' && s.size() - e == 3) s.insert(e + 2, "0");
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

Tensor new_parameter(const Shape& shape) {
  MemTagGuard tag(MemTag::parameter);
  return Tensor::empty(shape);
}
}  // namespace

// ---- Conv2d --------------------------------------------------------------------------------------
Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions o) : Conv2d(in, out, {kernel, kernel}, o) {}

Conv2d::Conv2d(int64_t in, int64_t out, std::pair<int64_t, int64_t> kernel, Conv2dOptions o)
    : in_channels(in), out_channels(out) {
  DUET_CHECK(in >= 1 && out >= 1 && kernel.first >= 1 && kernel.second >= 1,
             "Conv2d({}, {}, kernel_size={}): channels and kernel size must be >= 1", in, out,
             pair_str(kernel.first, kernel.second));
  DUET_CHECK(o.groups >= 1 && in % o.groups == 0 && out % o.groups == 0,
             "Conv2d({}, {}): groups={} must divide both channel counts", in, out, o.groups);
  DUET_CHECK(o.stride >= 1 && o.dilation >= 1 && o.padding >= 0,
             "Conv2d({}, {}): stride={} and dilation={} must be >= 1, padding={} must be >= 0", in, out, o.stride,
             o.dilation, o.padding);
  params = Conv2dParams{o.stride, o.stride, o.padding, o.padding, o.dilation, o.dilation, o.groups};
  weight = register_parameter("weight", new_parameter({out, in / o.groups, kernel.first, kernel.second}));
  kaiming_uniform_(weight, std::sqrt(5.0));
  if (o.bias) {
    bias = register_parameter("bias", new_parameter({out}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in(weight)));
    uniform_(bias, -bound, bound);
  }
}

Tensor Conv2d::forward(const Tensor& x) { return conv2d(x, weight, bias, params); }

std::string Conv2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", in_channels, out_channels,
                              pair_str(weight.size(2), weight.size(3)), pair_str(params.stride_h, params.stride_w));
  if (params.pad_h || params.pad_w) s += ", padding=" + pair_str(params.pad_h, params.pad_w);
  if (params.dilation_h != 1 || params.dilation_w != 1)
    s += ", dilation=" + pair_str(params.dilation_h, params.dilation_w);
  if (params.groups != 1) s += fmt::format(", groups={}", params.groups);
  if (!bias.defined()) s += ", bias=False";
  return s;
}

// ---- Linear --------------------------------------------------------------------------------------
Linear::Linear(int64_t in, int64_t out, bool has_bias) : in_features(in), out_features(out) {
  DUET_CHECK(in >= 1 && out >= 1, "Linear({}, {}): feature counts must be >= 1", in, out);
  weight = register_parameter("weight", new_parameter({out, in}));
  kaiming_uniform_(weight, std::sqrt(5.0));
  if (has_bias) {
    bias = register_parameter("bias", new_parameter({out}));
    const double bound = 1.0 / std::sqrt(static_cast<double>(in));
    uniform_(bias, -bound, bound);
  }
}

Tensor Linear::forward(const Tensor& x) { return linear(x, weight, bias); }

std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features, py_bool(bias.defined()));
}

// ---- BatchNorm2d ---------------------------------------------------------------------------------
BatchNorm2d::BatchNorm2d(int64_t channels, double eps_, double momentum_) : eps(eps_), momentum(momentum_) {
  DUET_CHECK(channels >= 1, "BatchNorm2d({}): channels must be >= 1", channels);
  DUET_CHECK(eps_ > 0, "BatchNorm2d({}): eps must be positive, got {}", channels, eps_);
  DUET_CHECK(momentum_ >= 0 && momentum_ <= 1, "BatchNorm2d({}): momentum must be in [0, 1], got {}", channels,
             momentum_);
  MemTagGuard tag(MemTag::parameter);
  weight = register_parameter("weight", Tensor::ones({channels}));
  bias = register_parameter("bias", Tensor::zeros({channels}));
  running_mean = register_buffer("running_mean", Tensor::zeros({channels}));
  running_var = register_buffer("running_var", Tensor::ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::i64));
}

Tensor BatchNorm2d::forward(const Tensor& x) { return run(x, std::nullopt, Tensor()); }

Tensor BatchNorm2d::forward_act(const Tensor& x, Activation act) { return run_in_scope(x, act, Tensor()); }

Tensor BatchNorm2d::forward_add(const Tensor& x, const Tensor& residual, std::optional<Activation> act) {
  DUET_CHECK(residual.defined(), "BatchNorm2d({}): forward_add needs a residual, got an undefined tensor", weight.size(0));
  return run_in_scope(x, act, residual);
}

// The fused entry points are called instead of operator(), so they open the module's profiler
// scope themselves.
Tensor BatchNorm2d::run_in_scope(const Tensor& x, std::optional<Activation> act, const Tensor& residual) {
  if (!profiler::enabled()) return run(x, act, residual);
  profiler::ScopeGuard scope(name());
  return run(x, act, residual);
}

Tensor BatchNorm2d::run(const Tensor& x, std::optional<Activation> act, const Tensor& residual) {
  DUET_CHECK(x.defined() && (x.dim() == 4 || x.dim() == 2),
             "BatchNorm2d: input has shape {}, expected [N, C, H, W] or [N, C]",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  DUET_CHECK(x.size(1) == weight.size(0), "BatchNorm2d({}): input has {} channels (shape {}), expected {}",
             weight.size(0), x.size(1), shape_str(x.shape()), weight.size(0));
  check_fused_activation("BatchNorm2d", act);
  const bool training = is_training();
  if (training) {
    // Kept for torchvision compatibility only (PyTorch reads it when momentum is None).
    if (num_batches_tracked.device() == Device::cpu()) {
      *num_batches_tracked.data<int64_t>() += 1;
    } else {
      NoGradGuard no_grad;
      num_batches_tracked.copy_(add(num_batches_tracked.to(DType::f64), 1.0));
    }
  }
  if (training && sum_over_replicas) return run_synced(x, act, residual);
  return batch_norm(x, weight, bias, running_mean, running_var, BatchNormParams{training, momentum, eps, act}, residual);
}

// Training-mode batch norm whose statistics are those of every replica's batch together: the
// same formulas as the batch_norm kernels (two passes: the mean, then the mean squared
// deviation), written as ops so that autograd differentiates through the replicas' sums.
Tensor BatchNorm2d::run_synced(const Tensor& x, std::optional<Activation> act, const Tensor& residual) {
  const int64_t C = x.size(1);
  const Shape per_channel = x.dim() == 4 ? Shape{1, C, 1, 1} : Shape{1, C};
  const std::vector<int64_t> dims = x.dim() == 4 ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0};
  const double local_count = static_cast<double>(x.numel() / C);
  const Tensor first = sum_over_replicas(
      cat({sum(x, dims), Tensor::full({1}, local_count, TensorOptions(x.dtype()).with_device(x.device()))}, 0));
  DUET_CHECK(first.defined() && first.shape() == Shape{C + 1},
             "BatchNorm2d({}): sum_over_replicas returned shape {}, expected [{}]", C,
             first.defined() ? shape_str(first.shape()) : std::string("undefined"), C + 1);
  const double count = first.slice(0, C, C + 1).item();
  const Tensor mean = mul(first.slice(0, 0, C), 1.0 / count);
  const Tensor centred = sub(x, mean.reshape(per_channel));
  const Tensor var = mul(sum_over_replicas(sum(mul(centred, centred), dims)), 1.0 / count);  // biased, as the kernels
  const Tensor scale = mul(rsqrt(add(var, eps)), weight);
  Tensor y = add(mul(centred, scale.reshape(per_channel)), bias.reshape(per_channel));
  if (residual.defined()) y = add(y, residual);
  if (act) y = activation(*act, y);
  {
    // The running variance is the unbiased estimate over all replicas' samples, as in PyTorch.
    NoGradGuard no_grad;
    const double unbiased = count > 1 ? count / (count - 1) : 1.0;
    running_mean.copy_(add(mul(running_mean, 1.0 - momentum), mul(mean.detach(), momentum)));
    running_var.copy_(add(mul(running_var, 1.0 - momentum), mul(var.detach(), momentum * unbiased)));
  }
  return y;
}

std::string BatchNorm2d::extra_repr() const {
  return fmt::format("{}, eps={}, momentum={}, affine=True, track_running_stats=True", weight.size(0), py_float(eps),
                     py_float(momentum));
}

// ---- LayerNorm -----------------------------------------------------------------------------------
LayerNorm::LayerNorm(int64_t dim, double eps_, bool affine) : eps(eps_) {
  DUET_CHECK(dim >= 1, "LayerNorm({}): dim must be >= 1", dim);
  DUET_CHECK(eps_ > 0, "LayerNorm({}): eps must be positive, got {}", dim, eps_);
  normalized_dim = dim;
  if (affine) {
    MemTagGuard tag(MemTag::parameter);
    weight = register_parameter("weight", Tensor::ones({dim}));
    bias = register_parameter("bias", Tensor::zeros({dim}));
  }
}

Tensor LayerNorm::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == normalized_dim,
             "LayerNorm({}): input has shape {}, expected the last dim to be {}", normalized_dim,
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), normalized_dim);
  return layer_norm(x, weight, bias, eps);
}

std::string LayerNorm::extra_repr() const {
  return fmt::format("({},), eps={}, elementwise_affine={}", normalized_dim, py_float(eps), py_bool(weight.defined()));
}

// ---- activations, pooling, glue ------------------------------------------------------------------
std::string Act::type_name() const { return activation_module_name(act); }

namespace {
Pool2dParams pool_params(const char* layer, int64_t kernel, int64_t stride, int64_t padding, bool ceil_mode,
                         bool count_include_pad) {
  DUET_CHECK(kernel >= 1 && stride >= 1 && padding >= 0 && 2 * padding <= kernel,
             "{}(kernel_size={}, stride={}, padding={}): expected kernel and stride >= 1 and 0 <= padding <= kernel/2",
             layer, kernel, stride, padding);
  return Pool2dParams{kernel, kernel, stride, stride, padding, padding, count_include_pad, ceil_mode};
}
}  // namespace

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding, bool ceil_mode)
    : params(pool_params("MaxPool2d", kernel, stride, padding, ceil_mode, true)) {}

std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}, dilation=1, ceil_mode={}", params.kernel_h,
                     params.stride_h, params.pad_h, py_bool(params.ceil_mode));
}

AvgPool2d::AvgPool2d(int64_t kernel, int64_t stride, int64_t padding, bool ceil_mode, bool count_include_pad)
    : params(pool_params("AvgPool2d", kernel, stride, padding, ceil_mode, count_include_pad)) {}

std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", params.kernel_h, params.stride_h, params.pad_h);
}

std::string AdaptiveAvgPool2d::extra_repr() const { return "output_size=" + pair_str(out_h, out_w); }
std::string Dropout::extra_repr() const { return fmt::format("p={}, inplace=False", py_float(p)); }
std::string Flatten::extra_repr() const { return fmt::format("start_dim={}, end_dim={}", start, end); }

Sequential::Sequential(std::initializer_list<ModulePtr> mods) {
  for (const ModulePtr& m : mods) push_back(m);
}

void Sequential::push_back(ModulePtr m) { push_back(std::to_string(children().size()), std::move(m)); }

void Sequential::push_back(const std::string& name, ModulePtr m) {
  DUET_CHECK(m != nullptr, "Sequential::push_back('{}'): the module is null", name);
  for (const auto& [n, c] : children())
    DUET_CHECK(n != name, "Sequential::push_back('{}'): a child of that name already exists", name);
  register_module(name, std::move(m));
}

Tensor Sequential::forward(const Tensor& x) {
  const auto& c = children();
  Tensor y = x;
  for (size_t i = 0; i < c.size(); ++i) {
    // A Conv2d whose only reader is the BatchNorm2d after it (and a ReLU or ReLU6 after that): one
    // conv_bn call, which fuses what it can (nn/conv_bn.h). A BatchNorm2d without a Conv2d before
    // it and a ReLU or ReLU6 after it (DenseNet's transitions): one batch_norm+relu op.
    auto* conv = dynamic_cast<Conv2d*>(c[i].second.get());
    auto* bn = conv && i + 1 < c.size() ? dynamic_cast<BatchNorm2d*>(c[i + 1].second.get())
                                        : dynamic_cast<BatchNorm2d*>(c[i].second.get());
    const size_t after_bn = conv ? i + 2 : i + 1;
    const auto* act = bn && after_bn < c.size() ? dynamic_cast<const Act*>(c[after_bn].second.get()) : nullptr;
    const bool fuse_act = act && batch_norm_fuses(act->act) && !act->alpha;
    if (conv && bn) {
      y = conv_bn(*conv, *bn, y, fuse_act ? std::optional(act->act) : std::nullopt);
      i += fuse_act ? 2 : 1;
    } else if (bn && fuse_act) {
      y = bn->forward_act(y, act->act);
      i += 1;
    } else {
      y = (*c[i].second)(y);
    }
  }
  return y;
}

}  // namespace duet::nn
