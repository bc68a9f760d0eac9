// Rebuilding the trained model from a duet checkpoint: the configuration stored in it (model
// name and options, classes, image size, class names, eval transform) and its weights.
#pragma once
#include <memory>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "train/train_config.h"
#include "engine/nn/module.h"

namespace duet::app {

struct TrainedModel {
  std::shared_ptr<nn::Module> model;  // weights loaded, eval mode, on the CPU
  TrainConfig config;
  nlohmann::json raw_config;
  std::vector<std::string> class_names;
  int64_t image_size = 0;
  int64_t epoch = 0;
};

// duet::Error naming the file when it is not a duet checkpoint or does not match its model.
TrainedModel load_trained_model(const std::string& checkpoint_path);

}  // namespace duet::app
