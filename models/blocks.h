// Building blocks the zoo shares and torch.nn / torchvision.ops have but engine/nn does not:
// Conv2dNormActivation, Permute, LayerNorm2d, StochasticDepth, and the initialisation walks
// each torchvision family applies after construction.
#pragma once
#include <memory>
#include <optional>
#include <vector>
#include "engine/nn/layers.h"

namespace duet::models {

// torchvision.ops.Conv2dNormActivation: Sequential(conv, norm, act) with "same" padding for odd
// kernels; the conv has no bias (the batch norm right after it has its own shift). The children
// keep torchvision's names ("0", "1", "2"); Sequential's forward runs the three as one
// nn::conv_bn call (a ReLU or ReLU6 fused, any other activation as its own module).
class ConvBnAct : public nn::Sequential {
public:
  ConvBnAct(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups, std::optional<Activation> act);
  std::shared_ptr<nn::Conv2d> conv;
  std::shared_ptr<nn::BatchNorm2d> bn;
  std::shared_ptr<nn::Act> act;  // child "2"; null without an activation
};
std::shared_ptr<ConvBnAct> conv_bn_act(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1, int64_t groups = 1,
                                       std::optional<Activation> act = Activation::relu);

// torchvision.ops.Permute: a view with the dims reordered (no copy; what the next op needs of
// the layout it asks for itself).
class Permute : public nn::Module {
public:
  explicit Permute(std::vector<int64_t> dims) : dims(std::move(dims)) {}
  Tensor forward(const Tensor& x) override { return x.permute(dims); }
  std::string type_name() const override { return "Permute"; }
  std::vector<int64_t> dims;
};

// torchvision's LayerNorm2d: layer norm over the channels of an NCHW tensor at every pixel,
// computed as permute to NHWC, layer_norm over the last dim, permute back. On channels-last
// activations both permutes are free views; on NCHW-contiguous ones layer_norm copies its input
// to NHWC first. Parameter names (weight, bias) as torch.nn.LayerNorm.
class LayerNorm2d : public nn::LayerNorm {
public:
  explicit LayerNorm2d(int64_t channels, double eps = 1e-6) : nn::LayerNorm(channels, eps) {}
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "LayerNorm2d"; }
};

// ConvNeXt V2's Global Response Normalization (Woo et al. 2023), timm's GlobalResponseNorm on a
// channels-last [N, H, W, C] input: each channel's L2 norm over the pixels, divided by the mean of
// those norms over the channels (+ eps), rescales x; out = x + weight * (x * that) + bias.
// weight and bias [C] start at zero, so the layer starts as the identity.
class GlobalResponseNorm : public nn::Module {
public:
  explicit GlobalResponseNorm(int64_t channels, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "GlobalResponseNorm"; }
  std::string extra_repr() const override;
  Tensor weight, bias;
  int64_t channels;
  double eps;
};

// torchvision.ops.StochasticDepth(p, "row"): in training, zeroes the whole residual branch of a
// sample with probability p and scales the survivors by 1/(1-p); identity in eval mode.
class StochasticDepth : public nn::Module {
public:
  explicit StochasticDepth(double p);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "StochasticDepth"; }
  std::string extra_repr() const override;
  double p;
};

// torchvision's _make_divisible (from the TF MobileNet code): v rounded to the nearest multiple
// of divisor, at least divisor, and never more than 10% below v.
int64_t make_divisible(double v, int64_t divisor = 8);

// Initialisation walks shared by several families (each names the torchvision code it mirrors).
// Every Conv2d weight kaiming-normal (fan_out when asked, relu gain), conv biases zero.
void init_convs_kaiming_normal(nn::Module& m, bool fan_out);

}  // namespace duet::models
