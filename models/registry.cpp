// The zoo's name table, option resolution and the parameter/FLOP counter.
#include "models/registry.h"
#include <cmath>
#include <regex>
#include "engine/autograd.h"
#include "engine/profiler/events.h"
#include "models/convnext.h"
#include "models/densenet.h"
#include "models/mlp.h"
#include "models/mobilenet.h"
#include "models/resnet.h"
#include "models/small_cnn.h"
#include "models/vit.h"

namespace duet::models {

namespace {
ModelInfo imagenet(const std::string& name, const std::string& family, const std::string& desc, bool tv = true) {
  return ModelInfo{name, family, desc, 224, 1000, tv};
}
ModelInfo cifar(const std::string& name, const std::string& family, const std::string& desc) {
  return ModelInfo{name, family, desc, 32, 10, false};
}

const std::vector<ModelInfo>& table() {
  static const std::vector<ModelInfo> t = [] {
    std::vector<ModelInfo> v;
    const std::vector<std::pair<std::string, std::string>> resnets{
        {"resnet18", "ResNet-18: BasicBlock, layers (2, 2, 2, 2), 11.7M parameters"},
        {"resnet34", "ResNet-34: BasicBlock, layers (3, 4, 6, 3), 21.8M parameters"},
        {"resnet50", "ResNet-50: Bottleneck, layers (3, 4, 6, 3), 25.6M parameters"},
        {"resnet101", "ResNet-101: Bottleneck, layers (3, 4, 23, 3), 44.5M parameters"},
        {"resnet152", "ResNet-152: Bottleneck, layers (3, 8, 36, 3), 60.2M parameters"}};
    for (const auto& [n, d] : resnets) v.push_back(imagenet(n, "resnet", d));
    v.push_back(imagenet("resnext50_32x4d", "resnet", "ResNeXt-50 32x4d: grouped 3x3 convs, 25.0M parameters"));
    v.push_back(imagenet("resnext101_32x8d", "resnet", "ResNeXt-101 32x8d: grouped 3x3 convs, 88.8M parameters"));
    v.push_back(imagenet("wide_resnet50_2", "resnet", "Wide ResNet-50-2: bottlenecks twice as wide, 68.9M parameters"));
    v.push_back(imagenet("wide_resnet101_2", "resnet", "Wide ResNet-101-2: bottlenecks twice as wide, 126.9M parameters"));
    for (const auto& [n, d] : resnets)
      v.push_back(cifar(n + "_cifar", "resnet", d.substr(0, d.find(':')) + " for 32x32 inputs: 3x3 stride-1 stem, no max-pool"));
    v.push_back(imagenet("densenet121", "densenet", "DenseNet-121: growth 32, blocks (6, 12, 24, 16), 8.0M parameters"));
    v.push_back(imagenet("densenet161", "densenet", "DenseNet-161: growth 48, blocks (6, 12, 36, 24), 28.7M parameters"));
    v.push_back(imagenet("densenet169", "densenet", "DenseNet-169: growth 32, blocks (6, 12, 32, 32), 14.1M parameters"));
    v.push_back(imagenet("densenet201", "densenet", "DenseNet-201: growth 32, blocks (6, 12, 48, 32), 20.0M parameters"));
    v.push_back(imagenet("densenet264", "densenet", "DenseNet-264: growth 32, blocks (6, 12, 64, 48), 33.3M parameters", false));
    v.push_back(imagenet("mobilenet_v1", "mobilenet", "MobileNet v1: 13 depthwise-separable blocks, 4.2M parameters", false));
    v.push_back(imagenet("mobilenet_v2", "mobilenet", "MobileNet v2: inverted residuals, ReLU6, 3.5M parameters"));
    v.push_back(imagenet("vit_b_16", "vit", "ViT-B/16: 12 layers, 768 wide, 12 heads, patch 16, 86.6M parameters"));
    v.push_back(imagenet("vit_b_32", "vit", "ViT-B/32: 12 layers, 768 wide, 12 heads, patch 32, 88.2M parameters"));
    v.push_back(imagenet("vit_l_16", "vit", "ViT-L/16: 24 layers, 1024 wide, 16 heads, patch 16, 304M parameters"));
    v.push_back(imagenet("vit_l_32", "vit", "ViT-L/32: 24 layers, 1024 wide, 16 heads, patch 32, 306M parameters"));
    v.push_back(imagenet("vit_h_14", "vit", "ViT-H/14: 32 layers, 1280 wide, 16 heads, patch 14, 632M parameters"));
    for (const auto& [size, desc] : std::vector<std::pair<std::string, std::string>>{
             {"tiny", "192 wide, 3 heads"}, {"small", "384 wide, 6 heads"}, {"base", "768 wide, 12 heads"}}) {
      v.push_back(cifar("vit_" + size + "_p4", "vit", "ViT-" + size + ": 12 layers, " + desc + ", patch 4 (32x32: 64 tokens)"));
      v.push_back(imagenet("vit_" + size + "_p16", "vit", "ViT-" + size + ": 12 layers, " + desc + ", patch 16", false));
    }
    for (const auto& [size, desc] : std::vector<std::pair<std::string, std::string>>{
             {"tiny", "192 wide, 3 heads, 5.7M parameters"},
             {"small", "384 wide, 6 heads, 22.1M parameters"},
             {"base", "768 wide, 12 heads, 86.6M parameters"}}) {
      v.push_back(imagenet("deit_" + size, "vit", "DeiT-" + size + ": ViT-" + size + "/16 (timm's deit_" + size +
                                                       "_patch16_224), " + desc, false));
      v.push_back(imagenet("deit_" + size + "_distilled", "vit",
                           "DeiT-" + size + " distilled: a distillation token and a second head (timm's deit_" + size +
                               "_distilled_patch16_224)",
                           false));
    }
    v.push_back(imagenet("convnext_tiny", "convnext", "ConvNeXt-T: widths 96..768, depths (3, 3, 9, 3), 28.6M parameters"));
    v.push_back(imagenet("convnext_small", "convnext", "ConvNeXt-S: widths 96..768, depths (3, 3, 27, 3), 50.2M parameters"));
    v.push_back(imagenet("convnext_base", "convnext", "ConvNeXt-B: widths 128..1024, depths (3, 3, 27, 3), 88.6M parameters"));
    v.push_back(imagenet("convnext_large", "convnext", "ConvNeXt-L: widths 192..1536, depths (3, 3, 27, 3), 197.8M parameters"));
    v.push_back(imagenet("convnextv2_nano", "convnext",
                         "ConvNeXt V2-N: GRN blocks, widths 80..640, depths (2, 2, 8, 2), 15.6M parameters (timm's)", false));
    v.push_back(imagenet("convnextv2_tiny", "convnext",
                         "ConvNeXt V2-T: GRN blocks, widths 96..768, depths (3, 3, 9, 3), 28.6M parameters (timm's)", false));
    v.push_back(cifar("small_cnn", "small_cnn", "three conv-BN-ReLU stages, width 16 (24k parameters): quick runs"));
    v.push_back(cifar("mlp", "mlp", "two hidden layers of 128 on flattened pixels"));
    return v;
  }();
  return t;
}

std::string known_names() {
  std::string s;
  for (const ModelInfo& m : table()) s += (s.empty() ? "" : ", ") + m.name;
  return s + ", vit_{tiny,small,base}_p<patch>";
}

int64_t scaled(int64_t base, double width_mult) {
  return std::max<int64_t>(1, std::llround(static_cast<double>(base) * width_mult));
}
}  // namespace

std::vector<ModelInfo> list_models() { return table(); }

ModelInfo model_info(const std::string& name) {
  for (const ModelInfo& m : table())
    if (m.name == name) return m;
  static const std::regex vit_pattern("vit_(tiny|small|base)_p([0-9]+)");
  std::smatch match;
  if (std::regex_match(name, match, vit_pattern)) {
    const int64_t patch = std::stoll(match[2]);
    ModelInfo m = patch <= 8 ? cifar(name, "vit", "") : imagenet(name, "vit", "", false);
    m.description = fmt::format("ViT-{}: 12 layers, patch {}", std::string(match[1]), patch);
    return m;
  }
  throw Error(fmt::format("unknown model '{}': known models are {}", name, known_names()));
}

std::shared_ptr<nn::Module> create_model(const std::string& name, const ModelOptions& o) {
  const ModelInfo info = model_info(name);
  DUET_CHECK(o.num_classes >= 0 && o.image_size >= 0 && o.patch_size >= 0 && o.in_channels >= 1 && o.width_mult > 0,
             "create_model('{}'): num_classes={}, image_size={}, patch_size={}, in_channels={}, width_mult={}: expected "
             "num_classes, image_size, patch_size >= 0 (0 = default), in_channels >= 1 and width_mult > 0",
             name, o.num_classes, o.image_size, o.patch_size, o.in_channels, o.width_mult);
  DUET_CHECK(o.dropout < 1 && o.stochastic_depth < 1,
             "create_model('{}'): dropout={} and stochastic_depth={}: expected values below 1 (negative = default)", name,
             o.dropout, o.stochastic_depth);
  DUET_CHECK(o.patch_size == 0 || info.family == "vit", "create_model('{}'): patch_size={} applies only to ViT models",
             name, o.patch_size);
  const int64_t classes = o.num_classes > 0 ? o.num_classes : info.default_num_classes;
  const int64_t image = o.image_size > 0 ? o.image_size : info.default_image_size;
  const std::string& f = info.family;
  if (f == "resnet") {
    ResNetConfig c = resnet_config(name, classes, o.width_mult);
    c.in_channels = o.in_channels;
    c.init = o.init;
    return std::make_shared<ResNet>(c);
  }
  if (f == "densenet") {
    DenseNetConfig c = densenet_config(name, classes, o.width_mult);
    c.in_channels = o.in_channels;
    c.init = o.init;
    if (o.dropout >= 0) c.drop_rate = o.dropout;
    return std::make_shared<DenseNet>(c);
  }
  if (name == "mobilenet_v1") {
    MobileNetV1Config c{.num_classes = classes, .in_channels = o.in_channels, .width_mult = o.width_mult, .init = o.init};
    if (o.dropout >= 0) c.dropout = o.dropout;
    return std::make_shared<MobileNetV1>(c);
  }
  if (name == "mobilenet_v2") {
    MobileNetV2Config c{.num_classes = classes, .in_channels = o.in_channels, .width_mult = o.width_mult};
    c.init = o.init;
    if (o.dropout >= 0) c.dropout = o.dropout;
    return std::make_shared<MobileNetV2>(c);
  }
  if (f == "vit") {
    ViTConfig c = vit_config(name, classes, image);
    c.in_channels = o.in_channels;
    c.init = o.init;
    if (o.patch_size > 0) c.patch_size = o.patch_size;
    if (o.dropout >= 0) c.dropout = o.dropout;
    if (o.width_mult != 1.0) {  // keep the head count and the 4x MLP ratio
      const int64_t hidden = c.num_heads * scaled(c.hidden_dim / c.num_heads, o.width_mult);
      c.mlp_dim = c.mlp_dim * hidden / c.hidden_dim;
      c.hidden_dim = hidden;
    }
    return std::make_shared<VisionTransformer>(c);
  }
  if (f == "convnext") {
    ConvNeXtConfig c = convnext_config(name, classes, o.width_mult);
    c.in_channels = o.in_channels;
    c.init = o.init;
    if (o.stochastic_depth >= 0) c.stochastic_depth_prob = o.stochastic_depth;
    return std::make_shared<ConvNeXt>(c);
  }
  if (f == "small_cnn") return small_cnn(classes, o.in_channels, scaled(16, o.width_mult));
  if (f == "mlp") return mlp(o.in_channels * image * image, classes, scaled(128, o.width_mult));
  throw Error(fmt::format("create_model('{}'): family '{}' has no constructor (a registry bug)", name, f));
}

ModelStats model_stats(nn::Module& model, int64_t image_size, int64_t in_channels) {
  DUET_CHECK(image_size >= 1 && in_channels >= 1, "model_stats: image_size={} and in_channels={}: expected >= 1",
             image_size, in_channels);
  ModelStats s;
  s.image_size = image_size;
  TensorOptions opts;
  for (const auto& [n, p] : model.named_parameters()) {
    if (s.parameters == 0) opts = TensorOptions(p.dtype()).with_device(p.device());
    s.parameters += p.numel();
    if (p.requires_grad()) s.trainable_parameters += p.numel();
    s.state_bytes += static_cast<int64_t>(p.nbytes());
  }
  for (const auto& [n, b] : model.named_buffers()) {
    s.buffer_elements += b.numel();
    s.state_bytes += static_cast<int64_t>(b.nbytes());
  }

  const bool was_training = model.is_training();
  const bool was_enabled = profiler::enabled();
  const bool had_events = !profiler::collect().empty();
  const Tensor x = Tensor::zeros({1, in_channels, image_size, image_size}, opts);
  model.eval();  // batch 1 has no batch statistics; eval is also what "FLOPs per image" means
  const int64_t t0 = profiler::now_ns();
  profiler::enable(true);
  try {
    NoGradGuard no_grad;
    model(x);
  } catch (...) {
    profiler::enable(was_enabled);
    model.train(was_training);
    throw;
  }
  const std::vector<OpEvent> events = profiler::collect();
  profiler::enable(was_enabled);
  model.train(was_training);
  for (const OpEvent& e : events)
    if (e.start_ns >= t0) s.forward_flops += e.flops;
  if (!was_enabled && !had_events) profiler::clear();  // leave no trace for a later profile
  return s;
}

ModelStats model_stats(const std::string& name, const ModelOptions& o) {
  const auto model = create_model(name, o);
  const int64_t image = o.image_size > 0 ? o.image_size : model_info(name).default_image_size;
  return model_stats(*model, image, o.in_channels);
}

}  // namespace duet::models
