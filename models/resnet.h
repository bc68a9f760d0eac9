// ResNet (He et al. 2015) as torchvision builds it (v1.5: the stride of a bottleneck sits on its
// 3x3 conv), with torchvision's parameter and buffer names, plus CIFAR variants (3x3 stride-1 stem,
// no max-pool) and ResNeXt / wide-ResNet bottlenecks.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "engine/nn/layers.h"

namespace duet::models {

struct ResNetConfig {
  bool bottleneck = false;              // BasicBlock (18, 34) or Bottleneck (50, 101, 152)
  std::vector<int64_t> layers{2, 2, 2, 2};  // blocks in layer1..layer4
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  int64_t base_width = 64;    // channels of the stem and layer1; layerN has base_width * 2^(N-1) planes
  int64_t groups = 1;         // ResNeXt cardinality (bottleneck only)
  int64_t width_per_group = 64;  // bottleneck inner width = planes * width_per_group / 64 * groups
  bool cifar_stem = false;    // conv1 3x3 stride 1, no max-pool: for 32x32 inputs
  bool zero_init_residual = false;  // last BN of each block starts at 0 (torchvision's option)
  bool init = true;  // false: skip torchvision's re-initialisation (layers keep torch.nn defaults); for loading weights
};

class BasicBlock : public nn::Module {
public:
  static constexpr int64_t expansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Module> downsample);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "BasicBlock"; }
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2;
  std::shared_ptr<nn::Act> relu;
  std::shared_ptr<nn::Module> downsample;  // null when the block keeps shape
};

class Bottleneck : public nn::Module {
public:
  static constexpr int64_t expansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<nn::Module> downsample,
             int64_t groups, int64_t width_per_group);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "Bottleneck"; }
  std::shared_ptr<nn::Conv2d> conv1, conv2, conv3;
  std::shared_ptr<nn::BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<nn::Act> relu;
  std::shared_ptr<nn::Module> downsample;
};

class ResNet : public nn::Module {
public:
  explicit ResNet(const ResNetConfig& cfg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ResNet"; }
  ResNetConfig config;
  std::shared_ptr<nn::Conv2d> conv1;
  std::shared_ptr<nn::BatchNorm2d> bn1;
  std::shared_ptr<nn::Module> relu, maxpool, avgpool;  // maxpool is Identity with the CIFAR stem
  std::shared_ptr<nn::Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<nn::Linear> fc;
};

// The named configurations: "resnet18" .. "resnet152", "resnext50_32x4d", "resnext101_32x8d",
// "wide_resnet50_2", "wide_resnet101_2" (torchvision's); a "_cifar" suffix selects the CIFAR
// stem. width_mult scales base_width (64) for narrow variants. Unknown names: duet::Error.
ResNetConfig resnet_config(const std::string& name, int64_t num_classes, double width_mult = 1.0);
std::shared_ptr<ResNet> resnet(const std::string& name, int64_t num_classes, double width_mult = 1.0);

}  // namespace duet::models
