// Building the model a run trains: a zoo model by name for the dataset's classes and image size,
// optionally initialised from a weights file (transfer learning: everything but the classifier
// head when the class count differs) with the backbone frozen.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/nn/module.h"

namespace duet::app {

// The model a run trains, as --model, --classes, --width-mult and --dropout set it
// (cli/run_options.h) and checkpoints store it.
struct ModelConfig {
  std::string name = "small_cnn";
  int64_t classes = 0;  // 0: the dataset's
  double width_mult = 1.0;
  double dropout = -1;  // < 0: the model's default
};

// classes and image_size must be resolved (> 0). Unknown names list the known ones.
std::shared_ptr<nn::Module> build_model(const ModelConfig& m, int64_t classes, int64_t image_size);

// The classifier head: the last Linear module's path ("fc", "classifier.1", "heads.head").
std::string head_prefix(const nn::Module& model);
// Every classifier head: the last Linear, and for a distilled DeiT the class token's head too.
std::vector<std::string> head_prefixes(const nn::Module& model);

// Loads a .safetensors weights file or duet checkpoint into `model`. When the file's head has the
// model's shape everything loads strictly; otherwise the head keeps its fresh initialisation
// (a new head for this dataset's classes). freeze: only the head trains. Prints what happened.
void init_from(nn::Module& model, const std::string& path, bool freeze, std::ostream& out);

// Stored in checkpoints under these names; a missing key reads as the default above.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(ModelConfig, name, classes, width_mult, dropout)

}  // namespace duet::app
