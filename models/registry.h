// The model zoo by name: create_model("resnet18", options), list_models(), and the exact size
// and cost of a model (parameters, forward FLOPs per image at a given input size). Every
// torchvision architecture duet has is reachable by its torchvision name, with torchvision's
// parameter and buffer names, so exported torchvision weights load one to one.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include "engine/nn/module.h"

namespace duet::models {

// 0 or a negative value means "the model's default" wherever it says so.
struct ModelOptions {
  int64_t num_classes = 0;     // 0: ModelInfo::default_num_classes (1000 ImageNet, 10 CIFAR-style)
  int64_t image_size = 0;      // 0: ModelInfo::default_image_size; fixes ViT's position embedding and mlp's input
  double width_mult = 1.0;     // channel multiplier: ResNet base width, DenseNet growth and stem,
                               // MobileNet channels, ConvNeXt stage widths, small_cnn width, mlp hidden size
  int64_t in_channels = 3;     // input image channels
  int64_t patch_size = 0;      // ViT: 0 keeps the name's patch size
  double dropout = -1;         // < 0: default. MobileNet classifier, ViT, DenseNet (after each dense layer)
  double stochastic_depth = -1;  // < 0: default. ConvNeXt's maximum drop probability
  // false: skip the family's torchvision initialisation (layers keep torch.nn's defaults). Saves
  // seconds on big models that are about to load weights anyway.
  bool init = true;
};

struct ModelInfo {
  std::string name;         // what create_model takes
  std::string family;       // resnet, densenet, mobilenet, vit, convnext, small_cnn, mlp
  std::string description;
  int64_t default_image_size = 224;
  int64_t default_num_classes = 1000;
  bool torchvision = false;  // same architecture, names and shapes as torchvision.models.<name>
};

// The registered names, grouped by family. ViT also accepts any vit_{tiny,small,base}_p<patch>.
std::vector<ModelInfo> list_models();
// The entry for a name (pattern names included); duet::Error listing the known names otherwise.
ModelInfo model_info(const std::string& name);
std::shared_ptr<nn::Module> create_model(const std::string& name, const ModelOptions& options = {});

struct ModelStats {
  int64_t parameters = 0;            // elements in all parameters
  int64_t trainable_parameters = 0;  // those with requires_grad
  int64_t buffer_elements = 0;       // running statistics and counters
  int64_t state_bytes = 0;       // parameters + buffers, as stored
  double forward_flops = 0;          // per image, eval mode, multiply-add = 2 FLOPs
  int64_t image_size = 0;            // the input size the FLOPs are for
};

// Counts the parameters and measures forward FLOPs by running one batch-1 forward in eval mode
// under NoGradGuard with the profiler on and summing OpEvent::flops (so the count is exactly
// what runs on the model's backend: convs, matmuls, norms, activations, pooling, adds). The
// model's mode is restored; events recorded before the call are kept.
ModelStats model_stats(nn::Module& model, int64_t image_size, int64_t in_channels = 3);
ModelStats model_stats(const std::string& name, const ModelOptions& options = {});

}  // namespace duet::models
