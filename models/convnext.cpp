// ConvNeXt (torchvision/models/convnext.py).
#include "models/convnext.h"
#include <cmath>
#include "engine/allocator.h"
#include "models/blocks.h"

namespace duet::models {

CNBlock::CNBlock(int64_t dim, double scale, double sd_prob, bool grn) {
  if (!grn) {
    MemTagGuard tag(MemTag::parameter);
    layer_scale = register_parameter("layer_scale", Tensor::full({dim, 1, 1}, scale));
  }
  block = register_module("block", std::make_shared<nn::Sequential>());
  block->push_back(std::make_shared<nn::Conv2d>(dim, dim, 7, nn::Conv2dOptions{.padding = 3, .groups = dim}));
  block->push_back(std::make_shared<Permute>(std::vector<int64_t>{0, 2, 3, 1}));
  block->push_back(std::make_shared<nn::LayerNorm>(dim, 1e-6));
  block->push_back(std::make_shared<nn::Linear>(dim, 4 * dim));
  block->push_back(nn::GELU());
  if (grn) block->push_back(std::make_shared<GlobalResponseNorm>(4 * dim));
  block->push_back(std::make_shared<nn::Linear>(4 * dim, dim));
  block->push_back(std::make_shared<Permute>(std::vector<int64_t>{0, 3, 1, 2}));
  stochastic_depth = register_module("stochastic_depth", std::make_shared<StochasticDepth>(sd_prob));
}

Tensor CNBlock::forward(const Tensor& x) {
  const Tensor branch = (*block)(x);
  return add((*stochastic_depth)(layer_scale.defined() ? mul(layer_scale, branch) : branch), x);
}

ConvNeXt::ConvNeXt(const ConvNeXtConfig& cfg) : config(cfg) {
  DUET_CHECK(!cfg.stages.empty(), "ConvNeXt: no stages given, expected at least one");
  int64_t total_blocks = 0;
  for (const auto& s : cfg.stages) {
    DUET_CHECK(s.channels >= 1 && s.num_layers >= 1, "ConvNeXt: stage (channels={}, num_layers={}): expected both >= 1",
               s.channels, s.num_layers);
    total_blocks += s.num_layers;
  }
  DUET_CHECK(cfg.num_classes >= 1 && cfg.in_channels >= 1, "ConvNeXt: num_classes={}, in_channels={}: expected >= 1",
             cfg.num_classes, cfg.in_channels);
  DUET_CHECK(cfg.version == 1 || cfg.version == 2, "ConvNeXt: version {} given, expected 1 or 2", cfg.version);
  DUET_CHECK(cfg.head_norm_eps > 0, "ConvNeXt: head_norm_eps {} given, expected > 0", cfg.head_norm_eps);
  DUET_CHECK(cfg.stochastic_depth_prob >= 0 && cfg.stochastic_depth_prob < 1,
             "ConvNeXt: stochastic_depth_prob {} given, expected [0, 1)", cfg.stochastic_depth_prob);

  features = register_module("features", std::make_shared<nn::Sequential>());
  auto stem = std::make_shared<nn::Sequential>();
  const int64_t c0 = cfg.stages[0].channels;
  stem->push_back(std::make_shared<nn::Conv2d>(cfg.in_channels, c0, 4, nn::Conv2dOptions{.stride = 4}));
  stem->push_back(std::make_shared<LayerNorm2d>(c0, 1e-6));
  features->push_back(stem);
  int64_t block_id = 0;
  for (size_t i = 0; i < cfg.stages.size(); ++i) {
    const auto& s = cfg.stages[i];
    auto stage = std::make_shared<nn::Sequential>();
    for (int64_t j = 0; j < s.num_layers; ++j, ++block_id) {
      // torchvision: drop probability grows linearly from 0 at the first block.
      const double sd = total_blocks > 1 ? cfg.stochastic_depth_prob * static_cast<double>(block_id) /
                                               static_cast<double>(total_blocks - 1)
                                         : 0.0;
      stage->push_back(std::make_shared<CNBlock>(s.channels, cfg.layer_scale, sd, cfg.version == 2));
    }
    features->push_back(stage);
    if (i + 1 < cfg.stages.size()) {
      auto down = std::make_shared<nn::Sequential>();
      down->push_back(std::make_shared<LayerNorm2d>(s.channels, 1e-6));
      down->push_back(std::make_shared<nn::Conv2d>(s.channels, cfg.stages[i + 1].channels, 2,
                                                   nn::Conv2dOptions{.stride = 2}));
      features->push_back(down);
    }
  }
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1, 1));
  const int64_t last = cfg.stages.back().channels;
  classifier = register_module("classifier", std::make_shared<nn::Sequential>());
  classifier->push_back(std::make_shared<LayerNorm2d>(last, cfg.head_norm_eps));
  classifier->push_back(std::make_shared<nn::Flatten>(1));
  classifier->push_back(std::make_shared<nn::Linear>(last, cfg.num_classes));

  // torchvision: every Conv2d and Linear weight truncated-normal with std 0.02, biases zero.
  // (torch truncates at +-2 absolute, i.e. +-100 std: in effect untruncated; duet's trunc_normal_
  // truncates at +-2 std, the intent of the timm code torchvision copied.)
  for (auto& [name, m] : named_modules()) {
    if (!cfg.init) break;
    Tensor w, b;
    if (auto* c = dynamic_cast<nn::Conv2d*>(m)) w = c->weight, b = c->bias;
    else if (auto* l = dynamic_cast<nn::Linear*>(m)) w = l->weight, b = l->bias;
    else continue;
    nn::trunc_normal_(w, 0.02);
    if (b.defined()) b.zero_();
  }
}

Tensor ConvNeXt::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == config.in_channels,
             "ConvNeXt: input has shape {}, expected [N, {}, H, W]",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), config.in_channels);
  return (*classifier)((*avgpool)((*features)(x)));
}

ConvNeXtConfig convnext_config(const std::string& name, int64_t num_classes, double width_mult) {
  DUET_CHECK(width_mult > 0, "convnext '{}': width_mult {} given, expected > 0", name, width_mult);
  ConvNeXtConfig c;
  int64_t w = 96;
  std::vector<int64_t> depths{3, 3, 9, 3};
  if (name == "convnext_tiny") c.stochastic_depth_prob = 0.1;
  else if (name == "convnext_small") depths = {3, 3, 27, 3}, c.stochastic_depth_prob = 0.4;
  else if (name == "convnext_base") w = 128, depths = {3, 3, 27, 3}, c.stochastic_depth_prob = 0.5;
  else if (name == "convnext_large") w = 192, depths = {3, 3, 27, 3}, c.stochastic_depth_prob = 0.5;
  else if (name == "convnextv2_nano") w = 80, depths = {2, 2, 8, 2}, c.stochastic_depth_prob = 0, c.version = 2;
  else if (name == "convnextv2_tiny") c.stochastic_depth_prob = 0, c.version = 2;
  else
    throw Error(fmt::format(
        "convnext: unknown configuration '{}': expected convnext_tiny, convnext_small, convnext_base, convnext_large, "
        "convnextv2_nano or convnextv2_tiny",
        name));
  c.stages.clear();
  for (size_t i = 0; i < depths.size(); ++i)
    c.stages.push_back({std::max<int64_t>(1, std::llround(static_cast<double>(w << i) * width_mult)), depths[i]});
  c.num_classes = num_classes;
  return c;
}

std::shared_ptr<ConvNeXt> convnext(const std::string& name, int64_t num_classes, double width_mult) {
  return std::make_shared<ConvNeXt>(convnext_config(name, num_classes, width_mult));
}

}  // namespace duet::models
