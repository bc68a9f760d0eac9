#include "models/hugging_face.h"
#include <array>
#include <map>
#include <regex>
#include <set>
#include <fmt/format.h>
#include <fmt/ranges.h>
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

// ---- ConvNeXt V1 and V2 ----------------------------------------------------------------------------

namespace {
// A block's tensors: transformers' name within encoder.stages.i.layers.j -> duet's within
// features.(2i+1).j, for V1 and V2 (nullptr: the version has no such tensor). duet's block is
// torchvision's Sequential: 0 dwconv, 1 permute, 2 layernorm, 3 Linear, 4 GELU, then V1's Linear at
// 5 and V2's GRN at 5 and Linear at 6.
struct BlockPart {
  const char* hf;
  const char* v1;
  const char* v2;
};
constexpr BlockPart kBlockParts[] = {
    {"dwconv.weight", "block.0.weight", "block.0.weight"},
    {"dwconv.bias", "block.0.bias", "block.0.bias"},
    {"layernorm.weight", "block.2.weight", "block.2.weight"},
    {"layernorm.bias", "block.2.bias", "block.2.bias"},
    {"pwconv1.weight", "block.3.weight", "block.3.weight"},
    {"pwconv1.bias", "block.3.bias", "block.3.bias"},
    {"grn.weight", nullptr, "block.5.weight"},
    {"grn.bias", nullptr, "block.5.bias"},
    {"pwconv2.weight", "block.5.weight", "block.6.weight"},
    {"pwconv2.bias", "block.5.bias", "block.6.bias"},
    {"layer_scale_parameter", "layer_scale", nullptr},
};

const char* part_name(const BlockPart& p, int version) { return version == 1 ? p.v1 : p.v2; }

const char* model_name(int version) {
  return version == 1 ? "ConvNextForImageClassification" : "ConvNextV2ForImageClassification";
}

// Names after the "convnext."/"convnextv2." prefix. Indices have at most three digits (published
// ConvNeXts have 4 stages of at most 30 blocks), so that a corrupt name cannot overflow std::stoll
// or ask the completeness check below for millions of blocks; a longer one has no place.
const std::regex kBlock(R"(encoder\.stages\.(\d{1,3})\.layers\.(\d{1,3})\.(.+))");
const std::regex kDownsample(R"(encoder\.stages\.(\d{1,3})\.downsampling_layer\.([01])\.(weight|bias))");
const std::regex kStem(R"(embeddings\.(patch_embeddings|layernorm)\.(weight|bias))");
const std::regex kFinalNorm(R"(layernorm\.(weight|bias))");
}  // namespace

int hugging_face_convnext_version(const NamedTensors& tensors) {
  int version = 0;
  for (const auto& [name, t] : tensors) {
    if (name.starts_with("convnextv2.")) return 2;
    if (name.starts_with("convnext.")) version = 1;
  }
  return version;
}

NamedTensors from_hugging_face_convnext(const NamedTensors& tensors) {
  const int version = hugging_face_convnext_version(tensors);
  DUET_CHECK(version != 0,
             "Hugging Face weights: no tensor name starts with 'convnext.' or 'convnextv2.', so this is no "
             "ConvNextForImageClassification or ConvNextV2ForImageClassification");
  const std::string prefix = version == 1 ? "convnext." : "convnextv2.";
  NamedTensors out;
  std::set<std::string> present;                       // transformers' names, without the prefix
  std::map<int64_t, int64_t> layers;                   // stage -> 1 + its highest block index
  std::map<std::pair<int64_t, int64_t>, int64_t> dim;  // (stage, block) -> channels, from dwconv.weight
  bool any_layer_scale = false;
  for (const auto& [name, t] : tensors) {
    // The head sits outside the base model's prefix, as in every ...ForImageClassification.
    if (name == "classifier.weight" || name == "classifier.bias") {
      out.emplace_back("classifier.2." + name.substr(name.find('.') + 1), t);
      continue;
    }
    DUET_CHECK(name.starts_with(prefix),
               "Hugging Face weights: tensor '{}' is not part of a {} (another model's, or a backbone's?)", name,
               model_name(version));
    const std::string rest = name.substr(prefix.size());
    present.insert(rest);
    std::smatch m;
    if (std::regex_match(rest, m, kBlock)) {
      const int64_t stage = std::stoll(m[1].str()), block = std::stoll(m[2].str());
      const BlockPart* part = nullptr;
      for (const BlockPart& p : kBlockParts)
        if (m[3].str() == p.hf && part_name(p, version) != nullptr) part = &p;
      DUET_CHECK(part != nullptr, "Hugging Face weights: no place in duet's ConvNeXt{} block for tensor '{}'",
                 version == 1 ? "" : " V2", name);
      layers[stage] = std::max(layers[stage], block + 1);
      const std::string hf = part->hf;
      Tensor v = t;
      if (hf == "dwconv.weight" && t.dim() >= 1) dim[{stage, block}] = t.size(0);
      // torchvision multiplies the NCHW branch by a [C, 1, 1] scale, transformers the NHWC one by [C].
      if (hf == "layer_scale_parameter") {
        any_layer_scale = true;
        if (t.dim() == 1) v = t.reshape({t.size(0), 1, 1});
      }
      // transformers' GRN keeps [1, 1, 1, C] to broadcast over NHWC; duet's (timm's) [C] does the same.
      if (hf == "grn.weight" || hf == "grn.bias")
        if (t.dim() == 4 && t.numel() == t.size(3)) v = t.reshape({t.size(3)});
      out.emplace_back(fmt::format("features.{}.{}.{}", 2 * stage + 1, block, part_name(*part, version)), v);
    } else if (std::regex_match(rest, m, kDownsample)) {
      // transformers opens stage i >= 1 with the downsampling that torchvision puts between stages.
      const int64_t stage = std::stoll(m[1].str());
      DUET_CHECK(stage >= 1, "Hugging Face weights: tensor '{}': duet's ConvNeXt has no downsampling before stage 0",
                 name);
      out.emplace_back(fmt::format("features.{}.{}.{}", 2 * stage, m[2].str(), m[3].str()), t);
    } else if (std::regex_match(rest, m, kStem)) {
      out.emplace_back(fmt::format("features.0.{}.{}", m[1].str() == "patch_embeddings" ? 0 : 1, m[2].str()), t);
    } else if (std::regex_match(rest, m, kFinalNorm)) {
      out.emplace_back("classifier.0." + m[1].str(), t);  // on the pooled features, before the head
    } else {
      throw Error(fmt::format("Hugging Face weights: no place in duet's ConvNeXt{} for tensor '{}'",
                              version == 1 ? "" : " V2", name));
    }
  }

  // Every tensor of the stem, of each stage up to the last one named and of each block up to the
  // last one named in its stage, so that a file missing one says which, in transformers' names.
  // (Whole stages or blocks past those, and the head, are checked against the model by the loader.)
  std::vector<std::string> missing;
  auto need = [&](const std::string& n) {
    if (!present.count(n)) missing.push_back(prefix + n);
  };
  for (const char* n : {"embeddings.patch_embeddings.weight", "embeddings.patch_embeddings.bias",
                        "embeddings.layernorm.weight", "embeddings.layernorm.bias", "layernorm.weight",
                        "layernorm.bias"})
    need(n);
  const int64_t stages = layers.empty() ? 0 : layers.rbegin()->first + 1;
  for (int64_t s = 0; s < stages; ++s) {
    if (s > 0)
      for (const char* n : {"0.weight", "0.bias", "1.weight", "1.bias"})
        need(fmt::format("encoder.stages.{}.downsampling_layer.{}", s, n));
    const int64_t blocks = layers.count(s) ? layers.at(s) : 1;
    for (int64_t j = 0; j < blocks; ++j)
      for (const BlockPart& p : kBlockParts) {
        if (part_name(p, version) == nullptr) continue;
        if (std::string(p.hf) == "layer_scale_parameter" && !any_layer_scale) continue;  // none at all: filled below
        need(fmt::format("encoder.stages.{}.layers.{}.{}", s, j, p.hf));
      }
  }
  if (!missing.empty()) {
    const size_t shown = std::min<size_t>(missing.size(), 6);
    throw Error(fmt::format("Hugging Face weights: {} tensor{} of a {} missing from the file: '{}'{}", missing.size(),
                            missing.size() == 1 ? "" : "s", model_name(version),
                            fmt::join(missing.begin(), missing.begin() + static_cast<std::ptrdiff_t>(shown), "', '"),
                            shown < missing.size() ? fmt::format(" and {} more", missing.size() - shown) : ""));
  }
  // A V1 built with layer_scale_init_value 0 has no layer scale; duet's V1 always has one, and a
  // scale of 1 multiplies exactly.
  if (version == 1 && !any_layer_scale)
    for (const auto& [block, channels] : dim)
      out.emplace_back(fmt::format("features.{}.{}.layer_scale", 2 * block.first + 1, block.second),
                       Tensor::ones({channels, 1, 1}));
  return out;
}

}  // namespace duet::models
