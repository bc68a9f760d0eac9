// Model construction and weight initialisation from files.
#include "train/model_setup.h"
#include <cmath>
#include <ostream>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "train/checkpoint.h"
#include "engine/error.h"
#include "engine/serialize.h"
#include "models/convnext.h"
#include "models/hugging_face.h"
#include "models/registry.h"
#include "models/vit.h"

namespace duet::app {

std::shared_ptr<nn::Module> build_model(const ModelConfig& m, int64_t classes, int64_t image_size) {
  models::ModelOptions o;
  o.num_classes = classes;
  o.image_size = image_size;
  o.width_mult = m.width_mult;
  o.dropout = m.dropout;
  return models::create_model(m.name, o);
}

std::string head_prefix(const nn::Module& model) {
  std::string head;
  for (const auto& [name, mod] : model.named_modules())
    if (mod->type_name() == "Linear") head = name;
  DUET_CHECK(!head.empty(), "the model has no Linear layer to treat as its classifier head");
  return head;
}

std::vector<std::string> head_prefixes(const nn::Module& model) {
  std::vector<std::string> heads{head_prefix(model)};
  for (const auto& [name, p] : model.named_parameters())
    if (name == "dist_token" && heads[0] == "head_dist") heads.push_back("heads.head");
  return heads;
}

namespace {
// A ViT's weights trained at another image size (or patch grid): resize the file's position
// embedding to the model's grid, as torchvision's interpolate_embeddings does.
void adapt_pos_embedding(const nn::Module& model, NamedTensors& tensors, std::ostream& out) {
  const std::string name = "encoder.pos_embedding";
  Tensor want;
  int64_t prefix = 1;  // the class token; DeiT's distillation token is a second
  for (const auto& [n, t] : model.named_parameters()) {
    if (n == name) want = t;
    if (n == "dist_token") prefix = 2;
  }
  if (!want.defined()) return;
  for (auto& [n, t] : tensors) {
    if (n != name || t.shape() == want.shape() || t.dim() != 3 || t.size(2) != want.size(2)) continue;
    const auto grid = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(want.size(1) - prefix))));
    const Shape was = t.shape();
    t = models::interpolate_pos_embedding(t, grid, prefix);
    out << fmt::format("{}: {} resized to {} (bicubic, as torchvision's interpolate_embeddings) for this image size\n",
                       name, shape_str(was), shape_str(t.shape()));
  }
}
}  // namespace

void init_from(nn::Module& model, const std::string& path, bool freeze, std::ostream& out) {
  const SafetensorsFile f = read_safetensors(path);
  NamedTensors tensors = model_tensors(f);
  if (models::is_hugging_face_vit(tensors)) {
    tensors = models::from_hugging_face_vit(tensors);
    out << fmt::format("'{}': Hugging Face transformers' ViT/DeiT names mapped to duet's\n", path);
  } else if (const int version = models::hugging_face_convnext_version(tensors)) {
    // V1 and V2 files differ in the blocks' middle (a GRN, no layer scale), which the loader would
    // report as a list of missing, unexpected and mis-shaped names; say what to pick instead.
    const auto* convnext = dynamic_cast<const models::ConvNeXt*>(&model);
    DUET_CHECK(convnext != nullptr && convnext->config.version == version,
               "'{}' holds a Hugging Face ConvNeXt{} (transformers' {}ForImageClassification): it loads into duet's "
               "{} models, not into this {}{}",
               path, version == 1 ? "" : " V2", version == 1 ? "ConvNext" : "ConvNextV2",
               version == 1 ? "ConvNeXt (convnext_tiny, convnext_small, ...)" : "ConvNeXt V2 (convnextv2_nano, ...)",
               model.type_name(), convnext != nullptr ? fmt::format(" V{}", convnext->config.version) : "");
    tensors = models::from_hugging_face_convnext(tensors);
    out << fmt::format("'{}': Hugging Face transformers' ConvNeXt{} names mapped to duet's\n", path,
                       version == 1 ? "" : " V2");
  }
  adapt_pos_embedding(model, tensors, out);
  const std::vector<std::string> heads = head_prefixes(model);
  const std::string& head = heads[0];
  // Same head shape: a fine-tune of the same task; else new heads for this dataset's classes.
  bool head_fits = false;
  for (const auto& [name, t] : model.named_parameters())
    if (has_prefix(name, head) && name.size() > head.size() && name.substr(head.size()) == ".weight")
      for (const auto& [fname, ft] : tensors)
        if (fname == name) head_fits = ft.shape() == t.shape();
  LoadOptions lo;
  if (!head_fits) lo.ignore_prefixes = heads;
  const LoadReport r = load_state_dict(model, tensors, lo);
  out << fmt::format("initialised from '{}': {} tensors loaded{}{}\n", path, r.loaded.size(),
                     head_fits ? "" : fmt::format("; new classifier head '{}' ({} tensors left initialised)",
                                                  fmt::join(heads, "', '"), r.ignored.size()),
                     r.converted.empty() ? "" : fmt::format("; {} converted ({})", r.converted.size(), r.converted[0]));
  if (freeze) {
    const int64_t frozen = freeze_backbone(model, heads);
    out << fmt::format("backbone frozen: {} parameters fixed, only '{}' trains\n", frozen, fmt::join(heads, "', '"));
  }
}


}  // namespace duet::app
