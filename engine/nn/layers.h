// The layers the model zoo is built from. Constructor arguments, parameter names and default
// initialisation follow torch.nn, so a model written here has torchvision's parameter names.
#pragma once
#include <array>
#include <functional>
#include <initializer_list>
#include <memory>
#include <mutex>
#include "engine/functional.h"
#include "engine/nn/module.h"

namespace duet::nn {

struct Conv2dOptions {
  int64_t stride = 1, padding = 0, dilation = 1, groups = 1;
  bool bias = true;
};

class Conv2d : public Module {
public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions o = {});
  Conv2d(int64_t in, int64_t out, std::pair<int64_t, int64_t> kernel, Conv2dOptions o = {});
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  Tensor weight, bias;  // bias undefined when o.bias == false
  Conv2dParams params;
  int64_t in_channels, out_channels;
  // What conv_bn (engine/nn/conv_bn.h) last folded for this layer and the batch norm after it, with
  // the storage and freeze of each tensor it was folded from: the next frozen forward of the same
  // tensors takes it from here instead of from the kept copies' map. Copies of the module share it.
  struct FoldedMemo {
    std::mutex mu;
    std::array<uint64_t, 12> sources{};
    Tensor weight, bias;
  };
  std::shared_ptr<FoldedMemo> folded_memo = std::make_shared<FoldedMemo>();
};

class Linear : public Module {
public:
  Linear(int64_t in, int64_t out, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Linear"; }
  std::string extra_repr() const override;
  Tensor weight, bias;
  int64_t in_features, out_features;
};

// BatchNorm2d also accepts [N, C] input (BatchNorm1d's job), which MLPs use.
class BatchNorm2d : public Module {
public:
  explicit BatchNorm2d(int64_t channels, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // act(forward(x)) as one fused op ("batch_norm+relu", "batch_norm+relu6" in the profiler; act
  // is relu or relu6), inside this module's profiler scope. Models keep their activation modules
  // registered, so names and printing stay torchvision's; they call this instead of running the
  // two modules one after the other.
  Tensor forward_act(const Tensor& x, Activation act);
  // forward(x) + residual, then act when given, as one fused op ("batch_norm+add+relu",
  // "batch_norm+add"): the end of a ResNet block or of MobileNetV2's inverted residual. One pass
  // writes the block's output instead of three (normalise, add, activation).
  Tensor forward_add(const Tensor& x, const Tensor& residual, std::optional<Activation> act);
  std::string type_name() const override { return "BatchNorm2d"; }
  std::string extra_repr() const override;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;  // names as torch.nn
  double eps, momentum;
  // Batch statistics over several replicas (SyncBatchNorm, for data-parallel training): when
  // set, training-mode forward computes per-channel sums with ordinary ops and hands them to this
  // function, which must return their element-wise sum over all replicas, differentiably (its
  // backward sums the incoming gradient the same way). The first call gets [C + 1] values, the
  // channel sums and the element count; the second the [C] sums of squared deviations from the
  // global mean. Whoever sets it (dist::sync_batch_norm) supplies the communication; the engine
  // only calls it. Unset: the fused batch_norm op, as always.
  std::function<Tensor(const Tensor&)> sum_over_replicas;

private:
  Tensor run_in_scope(const Tensor& x, std::optional<Activation> act, const Tensor& residual);
  Tensor run(const Tensor& x, std::optional<Activation> act, const Tensor& residual);
  Tensor run_synced(const Tensor& x, std::optional<Activation> act, const Tensor& residual);
};

class LayerNorm : public Module {
public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true);
  Tensor forward(const Tensor& x) override;  // over the last dim
  std::string type_name() const override { return "LayerNorm"; }
  std::string extra_repr() const override;
  Tensor weight, bias;  // undefined when affine == false
  double eps;
  int64_t normalized_dim;
};

// Any activation of engine/scalar_math.h as a module; alpha is its parameter (the activation's
// default when not given).
class Act : public Module {
public:
  explicit Act(Activation a, std::optional<double> alpha_ = std::nullopt) : act(a), alpha(alpha_) {}
  Tensor forward(const Tensor& x) override { return activation(act, x, alpha); }
  std::string type_name() const override;
  Activation act;
  std::optional<double> alpha;
};
inline std::shared_ptr<Act> ReLU() { return std::make_shared<Act>(Activation::relu); }
inline std::shared_ptr<Act> ReLU6() { return std::make_shared<Act>(Activation::relu6); }
inline std::shared_ptr<Act> GELU() { return std::make_shared<Act>(Activation::gelu_erf); }
inline std::shared_ptr<Act> LeakyReLU(double negative_slope = 0.01) {
  return std::make_shared<Act>(Activation::leaky_relu, negative_slope);
}

class MaxPool2d : public Module {
public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override { return max_pool2d(x, params); }
  std::string type_name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;
  Pool2dParams params;
};

class AvgPool2d : public Module {
public:
  AvgPool2d(int64_t kernel, int64_t stride, int64_t padding = 0, bool ceil_mode = false, bool count_include_pad = true);
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, params); }
  std::string type_name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;
  Pool2dParams params;
};

class AdaptiveAvgPool2d : public Module {
public:
  AdaptiveAvgPool2d(int64_t h, int64_t w) : out_h(h), out_w(w) {}
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, out_h, out_w); }
  std::string type_name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override;
  int64_t out_h, out_w;
};

class Dropout : public Module {
public:
  explicit Dropout(double p = 0.5) : p(p) {}
  Tensor forward(const Tensor& x) override { return dropout(x, p, is_training()); }
  std::string type_name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  double p;
};

class Flatten : public Module {
public:
  explicit Flatten(int64_t start = 1, int64_t end = -1) : start(start), end(end) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start, end); }
  std::string type_name() const override { return "Flatten"; }
  std::string extra_repr() const override;
  int64_t start, end;
};

class Identity : public Module {
public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string type_name() const override { return "Identity"; }
};

// Children named "0", "1", ... as torch.nn.Sequential. forward runs each child on the last one's
// output, except that a Conv2d followed by a BatchNorm2d (and a ReLU or ReLU6) runs as one
// nn::conv_bn call: the batch norm's pass fused with the activation in training, folded into the
// convolution in a frozen model (nn/conv_bn.h), and a BatchNorm2d followed by a ReLU or ReLU6 as
// one batch_norm+relu op (BatchNorm2d::forward_act). Same result, fewer passes.
class Sequential : public Module {
public:
  Sequential() = default;
  Sequential(std::initializer_list<ModulePtr> mods);
  void push_back(ModulePtr m);                          // named by its index
  void push_back(const std::string& name, ModulePtr m);  // named explicitly
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Sequential"; }
  size_t size() const { return children().size(); }
  Module& operator[](size_t i) const { return *children()[i].second; }
};

// A module made of a function (for glue like x.flatten(1) inside a Sequential).
class Lambda : public Module {
public:
  explicit Lambda(std::function<Tensor(const Tensor&)> fn, std::string label = "Lambda")
      : fn_(std::move(fn)), label_(std::move(label)) {}
  Tensor forward(const Tensor& x) override { return fn_(x); }
  std::string type_name() const override { return label_; }
private:
  std::function<Tensor(const Tensor&)> fn_;
  std::string label_;
};

// ---- initialisation (torch.nn.init), in place, with the default generator --------------------
void kaiming_uniform_(const Tensor& t, double a = 0.0, Generator* g = nullptr);   // fan_in, leaky_relu gain
void kaiming_normal_(const Tensor& t, bool fan_out = false, Generator* g = nullptr);  // relu gain
void xavier_uniform_(const Tensor& t, Generator* g = nullptr);
void trunc_normal_(const Tensor& t, double std = 0.02, Generator* g = nullptr);  // clipped at +-2 std
void normal_(const Tensor& t, double mean, double std, Generator* g = nullptr);
void uniform_(const Tensor& t, double lo, double hi, Generator* g = nullptr);
int64_t fan_in(const Tensor& t);
int64_t fan_out(const Tensor& t);

}  // namespace duet::nn
