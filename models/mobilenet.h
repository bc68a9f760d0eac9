// MobileNet v1 (Howard et al. 2017: depthwise-separable convs) and v2 (Sandler et al. 2018:
// inverted residuals with linear bottlenecks), both with a width multiplier. v2 is torchvision's
// mobilenet_v2 with its names; torchvision has no v1, so v1 follows v2's naming scheme:
//   features.0.{0,1}            stem: 3x3 stride-2 conv, BN (ReLU at .2)
//   features.i.conv.0.{0,1}     depthwise 3x3 conv, BN (ReLU at .2)        i = 1 .. 13
//   features.i.conv.1.{0,1}     pointwise 1x1 conv, BN (ReLU at .2)
//   classifier.1                Linear (Dropout at classifier.0)
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>
#include "engine/nn/layers.h"

namespace duet::models {

// ---- MobileNet v1 --------------------------------------------------------------------------------
struct MobileNetV1Config {
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  double width_mult = 1.0;  // channels are make_divisible(c * width_mult, 8), as in v2
  double dropout = 0.2;
  bool init = true;  // false: skip torchvision's re-initialisation (layers keep torch.nn defaults); for loading weights
};

// One depthwise-separable block: Sequential "conv" of (dw conv-BN-ReLU, pw conv-BN-ReLU).
class DepthwiseSeparable : public nn::Module {
public:
  DepthwiseSeparable(int64_t in, int64_t out, int64_t stride);
  Tensor forward(const Tensor& x) override { return (*conv)(x); }
  std::string type_name() const override { return "DepthwiseSeparable"; }
  std::shared_ptr<nn::Sequential> conv;
};

class MobileNetV1 : public nn::Module {
public:
  explicit MobileNetV1(const MobileNetV1Config& cfg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MobileNetV1"; }
  MobileNetV1Config config;
  std::shared_ptr<nn::Sequential> features, classifier;
};

// ---- MobileNet v2 --------------------------------------------------------------------------------
// One row of the v2 table: expansion t, output channels c, repeats n, first stride s.
struct InvertedResidualSetting {
  int64_t t, c, n, s;
};

struct MobileNetV2Config {
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  double width_mult = 1.0;
  int64_t round_nearest = 8;
  double dropout = 0.2;
  // Empty: the paper's table (torchvision's default).
  std::vector<InvertedResidualSetting> inverted_residual_setting;
  bool init = true;  // false: skip torchvision's re-initialisation (layers keep torch.nn defaults); for loading weights
};

class InvertedResidual : public nn::Module {
public:
  InvertedResidual(int64_t in, int64_t out, int64_t stride, int64_t expand_ratio);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "InvertedResidual"; }
  std::shared_ptr<nn::Sequential> conv;  // [expand 1x1] dw 3x3, project 1x1, BN
  bool use_res_connect;
};

class MobileNetV2 : public nn::Module {
public:
  explicit MobileNetV2(const MobileNetV2Config& cfg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MobileNetV2"; }
  MobileNetV2Config config;
  std::shared_ptr<nn::Sequential> features, classifier;
};

std::shared_ptr<MobileNetV1> mobilenet_v1(int64_t num_classes, double width_mult = 1.0);
std::shared_ptr<MobileNetV2> mobilenet_v2(int64_t num_classes, double width_mult = 1.0);

}  // namespace duet::models
