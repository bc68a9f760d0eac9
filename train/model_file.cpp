// Checkpoint -> model.
#include "train/model_file.h"
#include <fmt/format.h>
#include "train/checkpoint.h"
#include "engine/error.h"
#include "engine/serialize.h"

namespace duet::app {

TrainedModel load_trained_model(const std::string& path) {
  const Checkpoint ck = read_checkpoint(path);
  TrainedModel t;
  t.raw_config = ck.state.config;
  try {
    t.config = ck.state.config.get<TrainConfig>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("checkpoint '{}': its config is malformed ({})", path, e.what()));
  }
  t.class_names = ck.state.config.value("class_names", std::vector<std::string>{});
  t.image_size = ck.state.config.value("image_size", int64_t{0});
  t.epoch = ck.state.epoch;
  DUET_CHECK(t.image_size > 0 && t.config.model.classes > 0,
             "checkpoint '{}' does not record its image size and class count; expected a checkpoint of duet train", path);
  t.model = build_model(t.config.model, t.config.model.classes, t.image_size);
  load_state_dict(*t.model, ck.model, true);
  t.model->eval();
  t.model->freeze();  // for inference: weights converted once (nn::Module::freeze)
  return t;
}

}  // namespace duet::app
