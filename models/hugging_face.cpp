#include "models/hugging_face.h"
#include <array>
#include <map>
#include <regex>
#include <fmt/format.h>
#include "engine/error.h"
#include "engine/functional.h"

namespace duet::models {

namespace {
// transformers name (after the "vit."/"deit." prefix) -> duet name; "$" is the layer index.
// Both layouts: the published one and transformers 5's.
const std::vector<std::pair<std::regex, std::string>>& renames() {
  static const std::vector<std::pair<std::regex, std::string>> r = [] {
    const std::string L = "encoder.layers.encoder_layer_$1.";
    std::vector<std::pair<std::regex, std::string>> v;
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {R"(embeddings\.cls_token)", "class_token"},
             {R"(embeddings\.distillation_token)", "dist_token"},
             {R"(embeddings\.position_embeddings)", "encoder.pos_embedding"},
             {R"(embeddings\.patch_embeddings\.projection\.(weight|bias))", "conv_proj.$1"},
             {R"((?:encoder\.layer|layers)\.(\d+)\.layernorm_before\.(weight|bias))", L + "ln_1.$2"},
             {R"((?:encoder\.layer|layers)\.(\d+)\.layernorm_after\.(weight|bias))", L + "ln_2.$2"},
             {R"((?:encoder\.layer|layers)\.(\d+)\.(?:attention\.output\.dense|attention\.o_proj)\.(weight|bias))",
              L + "self_attention.out_proj.$2"},
             {R"((?:encoder\.layer|layers)\.(\d+)\.(?:intermediate\.dense|mlp\.fc1)\.(weight|bias))", L + "mlp.0.$2"},
             {R"((?:encoder\.layer|layers)\.(\d+)\.(?:output\.dense|mlp\.fc2)\.(weight|bias))", L + "mlp.3.$2"},
             {R"(layernorm\.(weight|bias))", "encoder.ln.$1"},
         })
      v.emplace_back(std::regex(from), to);
    return v;
  }();
  return r;
}

// The query, key or value projection of a layer, in either layout: (layer, 0/1/2 for q/k/v, weight|bias).
const std::regex kQkv(R"((?:encoder\.layer|layers)\.(\d+)\.attention\.(?:attention\.(query|key|value)|(q|k|v)_proj)\.(weight|bias))");
}  // namespace

bool is_hugging_face_vit(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors)
    if (name.starts_with("vit.") || name.starts_with("deit.")) return true;
  return false;
}

NamedTensors from_hugging_face_vit(const NamedTensors& tensors) {
  NamedTensors out;
  std::map<std::string, std::array<Tensor, 3>> qkv;  // "<layer>.weight" -> q, k, v
  bool has_classifier = false, has_distillation_token = false;
  for (const auto& [name, t] : tensors) {
    if (name == "classifier.weight" || name == "classifier.bias") {
      has_classifier = true;
      out.emplace_back("heads.head." + name.substr(name.find('.') + 1), t);
      continue;
    }
    if (name.starts_with("cls_classifier.")) {
      out.emplace_back("heads.head." + name.substr(name.find('.') + 1), t);
      continue;
    }
    if (name.starts_with("distillation_classifier.")) {
      out.emplace_back("head_dist." + name.substr(name.find('.') + 1), t);
      continue;
    }
    const size_t dot = name.find('.');
    const std::string rest = dot == std::string::npos ? name : name.substr(dot + 1);
    DUET_CHECK(name.starts_with("vit.") || name.starts_with("deit."),
               "Hugging Face weights: tensor '{}' is not part of a ViTForImageClassification or "
               "DeiTForImageClassificationWithTeacher (a pooler or another task's head?)",
               name);
    std::smatch m;
    if (std::regex_match(rest, m, kQkv)) {
      const std::string which = m[2].matched ? m[2].str() : m[3].str();
      const int i = which[0] == 'q' ? 0 : which[0] == 'k' ? 1 : 2;
      qkv[m[1].str() + "." + m[4].str()][static_cast<size_t>(i)] = t;
      continue;
    }
    if (rest == "embeddings.distillation_token") has_distillation_token = true;
    bool placed = false;
    for (const auto& [pattern, to] : renames()) {
      if (!std::regex_match(rest, pattern)) continue;
      out.emplace_back(std::regex_replace(rest, pattern, to), t);
      placed = true;
      break;
    }
    DUET_CHECK(placed, "Hugging Face weights: no place in duet's ViT for tensor '{}'", name);
  }
  DUET_CHECK(!(has_classifier && has_distillation_token),
             "Hugging Face weights: a DeiTForImageClassification (a distillation token, but one head on the class "
             "token only) has no duet model; use DeiTForImageClassificationWithTeacher's weights (duet's "
             "deit_*_distilled) or timm's");
  for (const auto& [key, parts] : qkv) {
    const std::string layer = key.substr(0, key.find('.')), kind = key.substr(key.find('.') + 1);
    for (size_t i = 0; i < 3; ++i)
      DUET_CHECK(parts[i].defined(), "Hugging Face weights: layer {} has no {} {} for its attention", layer,
                 i == 0 ? "query" : i == 1 ? "key" : "value", kind);
    out.emplace_back(fmt::format("encoder.layers.encoder_layer_{}.self_attention.in_proj_{}", layer, kind),
                     cat({parts[0], parts[1], parts[2]}, 0));
  }
  return out;
}

}  // namespace duet::models
