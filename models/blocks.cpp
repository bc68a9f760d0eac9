// The shared blocks of models/blocks.h.
#include "models/blocks.h"
#include <cmath>
#include "engine/allocator.h"
#include "engine/autograd.h"

namespace duet::models {

ConvBnAct::ConvBnAct(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups,
                     std::optional<Activation> a)
    : conv(std::make_shared<nn::Conv2d>(
          in, out, kernel,
          nn::Conv2dOptions{.stride = stride, .padding = (kernel - 1) / 2, .groups = groups, .bias = false})),
      bn(std::make_shared<nn::BatchNorm2d>(out)),
      act(a ? std::make_shared<nn::Act>(*a) : nullptr) {
  push_back(conv);
  push_back(bn);
  if (act) push_back(act);
}

std::shared_ptr<ConvBnAct> conv_bn_act(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t groups,
                                       std::optional<Activation> act) {
  return std::make_shared<ConvBnAct>(in, out, kernel, stride, groups, act);
}

Tensor LayerNorm2d::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == normalized_dim,
             "LayerNorm2d({}): input has shape {}, expected [N, {}, H, W]", normalized_dim,
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), normalized_dim);
  return layer_norm(x.permute({0, 2, 3, 1}), weight, bias, eps).permute({0, 3, 1, 2});
}

GlobalResponseNorm::GlobalResponseNorm(int64_t c, double e) : channels(c), eps(e) {
  DUET_CHECK(c >= 1 && e > 0, "GlobalResponseNorm: channels={} and eps={}: expected channels >= 1 and eps > 0", c, e);
  MemTagGuard tag(MemTag::parameter);
  weight = register_parameter("weight", Tensor::zeros({c}));
  bias = register_parameter("bias", Tensor::zeros({c}));
}

Tensor GlobalResponseNorm::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(3) == channels,
             "GlobalResponseNorm({}): input has shape {}, expected channels-last [N, H, W, {}]", channels,
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), channels);
  const Tensor g = sqrt(sum(square(x), {1, 2}, true));       // [N, 1, 1, C]: per-channel L2 norm
  const Tensor n = div(g, add(mean(g, {-1}, true), eps));  // relative to the mean over channels
  return add(add(mul(weight, mul(x, n)), bias), x);
}

std::string GlobalResponseNorm::extra_repr() const { return fmt::format("{}, eps={}", channels, eps); }

StochasticDepth::StochasticDepth(double p_) : p(p_) {
  DUET_CHECK(p_ >= 0.0 && p_ <= 1.0, "StochasticDepth: drop probability {} given, expected a value in [0, 1]", p_);
}

Tensor StochasticDepth::forward(const Tensor& x) {
  if (!is_training() || p == 0.0) return x;
  const double survival = 1.0 - p;
  if (survival == 0.0) return mul(x, 0.0);
  Shape mask_shape(x.dim(), 1);
  mask_shape[0] = x.size(0);
  Tensor mask;
  {
    NoGradGuard no_grad;
    const TensorOptions o = TensorOptions(x.dtype()).with_device(x.device());
    // keep = (u < survival), a Bernoulli(survival) draw per sample, scaled like inverted dropout.
    mask = mul(lt(Tensor::rand(mask_shape, o), Tensor::full({}, survival, o)), 1.0 / survival);
  }
  return mul(x, mask);
}

std::string StochasticDepth::extra_repr() const { return fmt::format("p={}, mode=row", p); }

int64_t make_divisible(double v, int64_t divisor) {
  int64_t new_v = std::max<int64_t>(divisor, static_cast<int64_t>(v + divisor / 2.0) / divisor * divisor);
  if (static_cast<double>(new_v) < 0.9 * v) new_v += divisor;
  return new_v;
}

void init_convs_kaiming_normal(nn::Module& m, bool fan_out) {
  for (auto& [name, mod] : m.named_modules()) {
    if (auto* c = dynamic_cast<nn::Conv2d*>(mod)) {
      nn::kaiming_normal_(c->weight, fan_out);
      if (c->bias.defined()) c->bias.zero_();
    }
  }
}

}  // namespace duet::models
