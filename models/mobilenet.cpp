// MobileNet v1 and v2 (torchvision/models/mobilenetv2.py for v2 and for the shared init).
#include "models/mobilenet.h"
#include <optional>
#include "engine/nn/conv_bn.h"
#include "engine/profiler/events.h"
#include "models/blocks.h"

namespace duet::models {

namespace {
// torchvision's MobileNetV2 init, used for v1 as well: convs kaiming-normal (fan_out), conv
// biases 0, BN 1 and 0, linear weights N(0, 0.01) and biases 0.
void init_mobilenet(nn::Module& m) {
  init_convs_kaiming_normal(m, /*fan_out=*/true);
  for (auto& [name, mod] : m.named_modules()) {
    if (auto* l = dynamic_cast<nn::Linear*>(mod)) {
      nn::normal_(l->weight, 0.0, 0.01);
      if (l->bias.defined()) l->bias.zero_();
    }
  }
}

void check_input(const char* model, const Tensor& x, int64_t in_channels) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_channels, "{}: input has shape {}, expected [N, {}, H, W]",
             model, x.defined() ? shape_str(x.shape()) : std::string("undefined"), in_channels);
}

std::shared_ptr<nn::Sequential> make_classifier(double dropout, int64_t in, int64_t num_classes) {
  auto c = std::make_shared<nn::Sequential>();
  c->push_back(std::make_shared<nn::Dropout>(dropout));
  c->push_back(std::make_shared<nn::Linear>(in, num_classes));
  return c;
}
}  // namespace

// ---- v1 ------------------------------------------------------------------------------------------
DepthwiseSeparable::DepthwiseSeparable(int64_t in, int64_t out, int64_t stride) {
  conv = register_module("conv", std::make_shared<nn::Sequential>());
  conv->push_back(conv_bn_act(in, in, 3, stride, /*groups=*/in, Activation::relu));
  conv->push_back(conv_bn_act(in, out, 1, 1, 1, Activation::relu));
}

MobileNetV1::MobileNetV1(const MobileNetV1Config& cfg) : config(cfg) {
  DUET_CHECK(cfg.num_classes >= 1 && cfg.in_channels >= 1 && cfg.width_mult > 0,
             "MobileNetV1: num_classes={}, in_channels={}, width_mult={}: expected counts >= 1 and width_mult > 0",
             cfg.num_classes, cfg.in_channels, cfg.width_mult);
  DUET_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "MobileNetV1: dropout {} given, expected [0, 1)", cfg.dropout);
  // (output channels, stride) of the 13 depthwise-separable blocks, from the paper's Table 1.
  static constexpr std::array<std::array<int64_t, 2>, 13> kBlocks{{{64, 1}, {128, 2}, {128, 1}, {256, 2}, {256, 1},
                                                                   {512, 2}, {512, 1}, {512, 1}, {512, 1}, {512, 1},
                                                                   {512, 1}, {1024, 2}, {1024, 1}}};
  const auto ch = [&](int64_t c) { return make_divisible(static_cast<double>(c) * cfg.width_mult, 8); };
  features = register_module("features", std::make_shared<nn::Sequential>());
  int64_t in = ch(32);
  features->push_back(conv_bn_act(cfg.in_channels, in, 3, 2, 1, Activation::relu));
  for (const auto& [c, s] : kBlocks) {
    features->push_back(std::make_shared<DepthwiseSeparable>(in, ch(c), s));
    in = ch(c);
  }
  classifier = register_module("classifier", make_classifier(cfg.dropout, in, cfg.num_classes));
  if (cfg.init) init_mobilenet(*this);
}

Tensor MobileNetV1::forward(const Tensor& x) {
  check_input("MobileNetV1", x, config.in_channels);
  return (*classifier)(adaptive_avg_pool2d((*features)(x), 1, 1).flatten(1));
}

// ---- v2 ------------------------------------------------------------------------------------------
InvertedResidual::InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio)
    : use_res_connect(stride == 1 && in == out) {
  DUET_CHECK(stride == 1 || stride == 2, "InvertedResidual: stride {} given, expected 1 or 2", stride);
  const int64_t hidden = std::llround(static_cast<double>(in * expand_ratio));
  conv = register_module("conv", std::make_shared<nn::Sequential>());
  if (expand_ratio != 1) conv->push_back(conv_bn_act(in, hidden, 1, 1, 1, Activation::relu6));
  conv->push_back(conv_bn_act(hidden, hidden, 3, stride, /*groups=*/hidden, Activation::relu6));
  conv->push_back(std::make_shared<nn::Conv2d>(hidden, out, 1, nn::Conv2dOptions{.bias = false}));
  conv->push_back(std::make_shared<nn::BatchNorm2d>(out));
}

Tensor InvertedResidual::forward(const Tensor& x) {
  if (!use_res_connect) return (*conv)(x);
  // The branch's last two modules, its projection and batch norm, run as one nn::conv_bn call that
  // adds x too. The branch's modules run one by one here, inside its profiler scope as (*conv)(x)
  // would open.
  std::optional<profiler::ScopeGuard> scope;
  if (profiler::enabled()) scope.emplace(conv->name());
  Tensor y = x;
  const size_t n = conv->size();
  for (size_t i = 0; i + 2 < n; ++i) y = (*conv)[i](y);
  return nn::conv_bn(static_cast<nn::Conv2d&>((*conv)[n - 2]), static_cast<nn::BatchNorm2d&>((*conv)[n - 1]), y,
                     std::nullopt, x);
}

MobileNetV2::MobileNetV2(const MobileNetV2Config& cfg_in) : config(cfg_in) {
  MobileNetV2Config& cfg = config;
  DUET_CHECK(cfg.num_classes >= 1 && cfg.in_channels >= 1 && cfg.width_mult > 0 && cfg.round_nearest >= 1,
             "MobileNetV2: num_classes={}, in_channels={}, width_mult={}, round_nearest={}: expected counts >= 1 and "
             "width_mult > 0",
             cfg.num_classes, cfg.in_channels, cfg.width_mult, cfg.round_nearest);
  DUET_CHECK(cfg.dropout >= 0 && cfg.dropout < 1, "MobileNetV2: dropout {} given, expected [0, 1)", cfg.dropout);
  if (cfg.inverted_residual_setting.empty())
    cfg.inverted_residual_setting = {{1, 16, 1, 1},  {6, 24, 2, 2},  {6, 32, 3, 2},  {6, 64, 4, 2},
                                     {6, 96, 3, 1},  {6, 160, 3, 2}, {6, 320, 1, 1}};
  for (const auto& r : cfg.inverted_residual_setting)
    DUET_CHECK(r.t >= 1 && r.c >= 1 && r.n >= 1 && r.s >= 1,
               "MobileNetV2: inverted residual row (t={}, c={}, n={}, s={}) given, expected all >= 1", r.t, r.c, r.n,
               r.s);
  const double w = cfg.width_mult;
  int64_t in = make_divisible(32 * w, cfg.round_nearest);
  const int64_t last = make_divisible(1280 * std::max(1.0, w), cfg.round_nearest);
  features = register_module("features", std::make_shared<nn::Sequential>());
  features->push_back(conv_bn_act(cfg.in_channels, in, 3, 2, 1, Activation::relu6));
  for (const auto& r : cfg.inverted_residual_setting) {
    const int64_t out = make_divisible(static_cast<double>(r.c) * w, cfg.round_nearest);
    for (int64_t i = 0; i < r.n; ++i) {
      features->push_back(std::make_shared<InvertedResidual>(in, out, i == 0 ? r.s : 1, r.t));
      in = out;
    }
  }
  features->push_back(conv_bn_act(in, last, 1, 1, 1, Activation::relu6));
  classifier = register_module("classifier", make_classifier(cfg.dropout, last, cfg.num_classes));
  if (cfg.init) init_mobilenet(*this);
}

Tensor MobileNetV2::forward(const Tensor& x) {
  check_input("MobileNetV2", x, config.in_channels);
  return (*classifier)(adaptive_avg_pool2d((*features)(x), 1, 1).flatten(1));
}

std::shared_ptr<MobileNetV1> mobilenet_v1(int64_t num_classes, double width_mult) {
  return std::make_shared<MobileNetV1>(MobileNetV1Config{.num_classes = num_classes, .width_mult = width_mult});
}

std::shared_ptr<MobileNetV2> mobilenet_v2(int64_t num_classes, double width_mult) {
  return std::make_shared<MobileNetV2>(MobileNetV2Config{.num_classes = num_classes, .width_mult = width_mult});
}

}  // namespace duet::models
