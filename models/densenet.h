// DenseNet-BC (Huang et al. 2016) as torchvision builds it, with torchvision's names
// (features.denseblock1.denselayer1.norm1.weight, features.transition1.conv.weight, ...).
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "engine/nn/layers.h"

namespace duet::models {

struct DenseNetConfig {
  int64_t growth_rate = 32;                     // k: channels each dense layer adds
  std::vector<int64_t> block_config{6, 12, 24, 16};  // dense layers per block
  int64_t num_init_features = 64;               // channels of the stem conv
  int64_t bn_size = 4;                          // the 1x1 bottleneck has bn_size * k channels
  double drop_rate = 0.0;                       // dropout after each dense layer
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  bool init = true;  // false: skip torchvision's re-initialisation (layers keep torch.nn defaults); for loading weights
};

// norm1-relu1-conv1(1x1)-norm2-relu2-conv2(3x3) on the concatenation of all earlier features.
class DenseLayer : public nn::Module {
public:
  DenseLayer(int64_t num_input_features, int64_t growth_rate, int64_t bn_size, double drop_rate);
  Tensor forward(const Tensor& concatenated) override;
  std::string type_name() const override { return "_DenseLayer"; }
  std::shared_ptr<nn::BatchNorm2d> norm1, norm2;
  std::shared_ptr<nn::Act> relu1, relu2;
  std::shared_ptr<nn::Conv2d> conv1, conv2;
  double drop_rate;
};

class DenseBlock : public nn::Module {
public:
  DenseBlock(int64_t num_layers, int64_t num_input_features, int64_t bn_size, int64_t growth_rate, double drop_rate);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "_DenseBlock"; }
  std::vector<std::shared_ptr<DenseLayer>> layers;  // children "denselayer1", ...
};

class DenseNet : public nn::Module {
public:
  explicit DenseNet(const DenseNetConfig& cfg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "DenseNet"; }
  DenseNetConfig config;
  std::shared_ptr<nn::Sequential> features;  // conv0 norm0 relu0 pool0 denseblock1 transition1 ... norm5
  std::shared_ptr<nn::Linear> classifier;
};

// "densenet121", "densenet161", "densenet169", "densenet201" (torchvision's) and "densenet264"
// (growth 32, blocks (6, 12, 64, 48); not in torchvision). width_mult scales the growth rate
// and the stem width. Unknown names: duet::Error.
DenseNetConfig densenet_config(const std::string& name, int64_t num_classes, double width_mult = 1.0);
std::shared_ptr<DenseNet> densenet(const std::string& name, int64_t num_classes, double width_mult = 1.0);

}  // namespace duet::models
