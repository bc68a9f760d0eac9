// ConvNeXt (Liu et al. 2022) as torchvision builds it: patchify stem (4x4 stride-4 conv +
// LayerNorm2d), stages of CNBlocks (depthwise 7x7, LayerNorm, Linear 4x, GELU, Linear, layer
// scale, stochastic depth), LayerNorm2d + 2x2 stride-2 conv between stages; torchvision's names
// (features.1.0.block.0.weight, features.1.0.layer_scale, classifier.2.weight, ...).
//
// ConvNeXt V2 (Woo et al. 2023, timm's convnextv2_*): the same network with a Global Response
// Normalization after the GELU of every block (block.5, shifting the second Linear to block.6)
// and no layer scale; named like V1 (tests/golden/make_timm_goldens.py maps timm's names).
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "engine/nn/layers.h"

namespace duet::models {

struct ConvNeXtStage {
  int64_t channels;   // input_channels of torchvision's CNBlockConfig
  int64_t num_layers;
};

struct ConvNeXtConfig {
  std::vector<ConvNeXtStage> stages{{96, 3}, {192, 3}, {384, 9}, {768, 3}};  // convnext_tiny
  double stochastic_depth_prob = 0.1;  // torchvision's convnext_tiny default; linear in block index
  double layer_scale = 1e-6;  // V1 only
  int version = 1;            // 2: ConvNeXt V2 (GRN, no layer scale)
  // eps of the classifier's LayerNorm2d (classifier.0): torchvision's 1e-6. transformers' ConvNext
  // takes its config's layer_norm_eps there (1e-12 by default); the block and downsampling norms are
  // 1e-6 in all three.
  double head_norm_eps = 1e-6;
  int64_t num_classes = 1000;
  int64_t in_channels = 3;
  bool init = true;  // false: skip torchvision's re-initialisation (layers keep torch.nn defaults); for loading weights
};

class CNBlock : public nn::Module {
public:
  // grn: ConvNeXt V2's block (GRN after the GELU, no layer scale).
  CNBlock(int64_t dim, double layer_scale, double stochastic_depth_prob, bool grn = false);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "CNBlock"; }
  Tensor layer_scale;  // [dim, 1, 1]; undefined in V2
  // dw conv 7x7, Permute NHWC, LayerNorm (eps 1e-6), Linear dim->4dim, GELU, [V2: GRN,] Linear 4dim->dim,
  // Permute NCHW
  std::shared_ptr<nn::Sequential> block;
  std::shared_ptr<nn::Module> stochastic_depth;
};

class ConvNeXt : public nn::Module {
public:
  explicit ConvNeXt(const ConvNeXtConfig& cfg);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "ConvNeXt"; }
  ConvNeXtConfig config;
  std::shared_ptr<nn::Sequential> features, classifier;  // classifier: LayerNorm2d, Flatten, Linear
  std::shared_ptr<nn::Module> avgpool;
};

// "convnext_tiny" (torchvision's), "convnext_small" (3, 3, 27, 3), "convnext_base" (128 wide),
// "convnext_large" (192 wide); ConvNeXt V2's "convnextv2_nano" (80 wide, depths (2, 2, 8, 2)) and
// "convnextv2_tiny" (96 wide, (3, 3, 9, 3)), without stochastic depth (timm's default). width_mult
// scales the stage widths. Unknown names: duet::Error.
ConvNeXtConfig convnext_config(const std::string& name, int64_t num_classes, double width_mult = 1.0);
std::shared_ptr<ConvNeXt> convnext(const std::string& name, int64_t num_classes, double width_mult = 1.0);

}  // namespace duet::models
