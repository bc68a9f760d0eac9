// ResNet, its blocks and its named configurations (torchvision/models/resnet.py).
#include "models/resnet.h"
#include <cmath>
#include "engine/nn/conv_bn.h"
#include "models/blocks.h"

namespace duet::models {

namespace {
std::shared_ptr<nn::Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride = 1, int64_t groups = 1) {
  return std::make_shared<nn::Conv2d>(in, out, 3,
                                      nn::Conv2dOptions{.stride = stride, .padding = 1, .groups = groups, .bias = false});
}
std::shared_ptr<nn::Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride = 1) {
  return std::make_shared<nn::Conv2d>(in, out, 1, nn::Conv2dOptions{.stride = stride, .bias = false});
}

std::string shape_or_undefined(const Tensor& x) { return x.defined() ? shape_str(x.shape()) : "undefined"; }
}  // namespace

// ---- blocks --------------------------------------------------------------------------------------
// Registration order is torchvision's, so named_parameters() lists tensors in its order.
BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Module> ds) {
  conv1 = register_module("conv1", conv3x3(inplanes, planes, stride));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(planes));
  relu = register_module("relu", nn::ReLU());
  conv2 = register_module("conv2", conv3x3(planes, planes));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(planes));
  if (ds) downsample = register_module("downsample", std::move(ds));
}

// Each convolution with its batch norm, ReLU and residual as one nn::conv_bn call: the batch norm's
// pass fused with them in training, folded into the convolution in a frozen model.
Tensor BasicBlock::forward(const Tensor& x) {
  const Tensor out = nn::conv_bn(*conv1, *bn1, x, Activation::relu);
  const Tensor identity = downsample ? (*downsample)(x) : x;
  return nn::conv_bn(*conv2, *bn2, out, Activation::relu, identity);  // relu(bn2(conv2(out)) + identity)
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Module> ds,
                       int64_t groups, int64_t width_per_group) {
  // int(planes * (base_width / 64.0)) * groups, exactly as torchvision rounds it.
  const int64_t width =
      static_cast<int64_t>(static_cast<double>(planes) * (static_cast<double>(width_per_group) / 64.0)) * groups;
  conv1 = register_module("conv1", conv1x1(inplanes, width));
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(width));
  conv2 = register_module("conv2", conv3x3(width, width, stride, groups));
  bn2 = register_module("bn2", std::make_shared<nn::BatchNorm2d>(width));
  conv3 = register_module("conv3", conv1x1(width, planes * expansion));
  bn3 = register_module("bn3", std::make_shared<nn::BatchNorm2d>(planes * expansion));
  relu = register_module("relu", nn::ReLU());
  if (ds) downsample = register_module("downsample", std::move(ds));
}

Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = nn::conv_bn(*conv1, *bn1, x, Activation::relu);
  out = nn::conv_bn(*conv2, *bn2, out, Activation::relu);
  const Tensor identity = downsample ? (*downsample)(x) : x;
  return nn::conv_bn(*conv3, *bn3, out, Activation::relu, identity);  // relu(bn3(conv3(out)) + identity)
}

// ---- the network ---------------------------------------------------------------------------------
ResNet::ResNet(const ResNetConfig& cfg) : config(cfg) {
  DUET_CHECK(cfg.layers.size() == 4, "ResNet: layers has {} entries, expected 4 (blocks in layer1..layer4)",
             cfg.layers.size());
  for (int64_t n : cfg.layers) DUET_CHECK(n >= 1, "ResNet: layers {} given, expected every count >= 1", shape_str(cfg.layers));
  DUET_CHECK(cfg.num_classes >= 1 && cfg.in_channels >= 1 && cfg.base_width >= 1,
             "ResNet: num_classes={}, in_channels={}, base_width={}: expected all >= 1", cfg.num_classes,
             cfg.in_channels, cfg.base_width);
  DUET_CHECK(cfg.bottleneck || (cfg.groups == 1 && cfg.width_per_group == 64),
             "ResNet: BasicBlock only supports groups=1 and width_per_group=64, got groups={} width_per_group={}",
             cfg.groups, cfg.width_per_group);
  DUET_CHECK(cfg.groups >= 1 && cfg.width_per_group >= 1, "ResNet: groups={} and width_per_group={} must be >= 1",
             cfg.groups, cfg.width_per_group);

  int64_t inplanes = cfg.base_width;
  if (cfg.cifar_stem) {
    conv1 = register_module("conv1", conv3x3(cfg.in_channels, inplanes));
  } else {
    conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(
                                         cfg.in_channels, inplanes, 7,
                                         nn::Conv2dOptions{.stride = 2, .padding = 3, .bias = false}));
  }
  bn1 = register_module("bn1", std::make_shared<nn::BatchNorm2d>(inplanes));
  relu = register_module("relu", nn::ReLU());
  if (cfg.cifar_stem) maxpool = register_module("maxpool", std::make_shared<nn::Identity>());
  else maxpool = register_module("maxpool", std::make_shared<nn::MaxPool2d>(3, 2, 1));

  const int64_t expansion = cfg.bottleneck ? Bottleneck::expansion : BasicBlock::expansion;
  auto make_layer = [&](int64_t planes, int64_t blocks, int64_t stride) {
    auto layer = std::make_shared<nn::Sequential>();
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t s = i == 0 ? stride : 1;
      std::shared_ptr<nn::Module> ds;
      if (i == 0 && (stride != 1 || inplanes != planes * expansion)) {
        auto seq = std::make_shared<nn::Sequential>();
        seq->push_back(conv1x1(inplanes, planes * expansion, stride));
        seq->push_back(std::make_shared<nn::BatchNorm2d>(planes * expansion));
        ds = seq;
      }
      if (cfg.bottleneck)
        layer->push_back(std::make_shared<Bottleneck>(inplanes, planes, s, ds, cfg.groups, cfg.width_per_group));
      else
        layer->push_back(std::make_shared<BasicBlock>(inplanes, planes, s, ds));
      inplanes = planes * expansion;
    }
    return layer;
  };
  const int64_t w = cfg.base_width;
  layer1 = register_module("layer1", make_layer(w, cfg.layers[0], 1));
  layer2 = register_module("layer2", make_layer(2 * w, cfg.layers[1], 2));
  layer3 = register_module("layer3", make_layer(4 * w, cfg.layers[2], 2));
  layer4 = register_module("layer4", make_layer(8 * w, cfg.layers[3], 2));
  avgpool = register_module("avgpool", std::make_shared<nn::AdaptiveAvgPool2d>(1, 1));
  fc = register_module("fc", std::make_shared<nn::Linear>(8 * w * expansion, cfg.num_classes));

  // torchvision: convs kaiming-normal (fan_out, relu); BN weight 1, bias 0 (the BatchNorm2d
  // constructor's values); fc keeps nn.Linear's default.
  if (cfg.init) init_convs_kaiming_normal(*this, /*fan_out=*/true);
  if (cfg.zero_init_residual) {
    for (auto& [name, m] : named_modules()) {
      if (auto* b = dynamic_cast<Bottleneck*>(m)) b->bn3->weight.zero_();
      if (auto* b = dynamic_cast<BasicBlock*>(m)) b->bn2->weight.zero_();
    }
  }
}

Tensor ResNet::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == config.in_channels,
             "ResNet: input has shape {}, expected [N, {}, H, W]", shape_or_undefined(x), config.in_channels);
  Tensor y = (*maxpool)(nn::conv_bn(*conv1, *bn1, x, Activation::relu));
  y = (*layer4)((*layer3)((*layer2)((*layer1)(y))));
  return (*fc)((*avgpool)(y).flatten(1));
}

ResNetConfig resnet_config(const std::string& name_in, int64_t num_classes, double width_mult) {
  DUET_CHECK(width_mult > 0, "resnet '{}': width_mult {} given, expected > 0", name_in, width_mult);
  ResNetConfig c;
  std::string name = name_in;
  const std::string cifar = "_cifar";
  if (name.size() > cifar.size() && name.ends_with(cifar)) {
    c.cifar_stem = true;
    name.resize(name.size() - cifar.size());
  }
  if (name == "resnet18") c.layers = {2, 2, 2, 2};
  else if (name == "resnet34") c.layers = {3, 4, 6, 3};
  else if (name == "resnet50") c.bottleneck = true, c.layers = {3, 4, 6, 3};
  else if (name == "resnet101") c.bottleneck = true, c.layers = {3, 4, 23, 3};
  else if (name == "resnet152") c.bottleneck = true, c.layers = {3, 8, 36, 3};
  else if (name == "resnext50_32x4d") c.bottleneck = true, c.layers = {3, 4, 6, 3}, c.groups = 32, c.width_per_group = 4;
  else if (name == "resnext101_32x8d") c.bottleneck = true, c.layers = {3, 4, 23, 3}, c.groups = 32, c.width_per_group = 8;
  else if (name == "wide_resnet50_2") c.bottleneck = true, c.layers = {3, 4, 6, 3}, c.width_per_group = 128;
  else if (name == "wide_resnet101_2") c.bottleneck = true, c.layers = {3, 4, 23, 3}, c.width_per_group = 128;
  else
    throw Error(fmt::format("resnet: unknown configuration '{}': expected resnet18, resnet34, resnet50, resnet101, "
                            "resnet152, resnext50_32x4d, resnext101_32x8d, wide_resnet50_2 or wide_resnet101_2, "
                            "optionally with the suffix _cifar",
                            name_in));
  c.num_classes = num_classes;
  c.base_width = std::max<int64_t>(1, std::llround(64.0 * width_mult));
  return c;
}

std::shared_ptr<ResNet> resnet(const std::string& name, int64_t num_classes, double width_mult) {
  return std::make_shared<ResNet>(resnet_config(name, num_classes, width_mult));
}

}  // namespace duet::models
