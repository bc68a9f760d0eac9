// Training checkpoints: one safetensors file holding the model ("model.<name>": parameters and
// buffers), the optimizer state ("optimizer.<name>") and, in the metadata, where the run stands
// (epochs and steps done, the random generator's seed and offset, the fp16 loss scale) and its
// configuration. Written
// atomically by engine/serialize.h: a crash mid-write leaves the previous checkpoint intact.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/serialize.h"

namespace duet::optim {
class Optimizer;
}

namespace duet::app {

inline constexpr const char* kCheckpointFormat = "duet.checkpoint/1";

struct CheckpointState {
  int64_t epoch = 0;  // epochs completed
  int64_t step = 0;   // optimizer steps done (the lr schedule's position)
  uint64_t generator_seed = 0, generator_offset = 0;  // default_generator() after those steps
  nlohmann::json config;   // the run's TrainConfig (model, data, optimizer, schedule)
  nlohmann::json metrics;  // the last epoch's metrics
  // The fp16 loss scaler's state ({"scale", "growth_tracker", "skipped_steps"}); null when the run
  // has no scaler (f32 or bf16), so files of those runs are unchanged.
  nlohmann::json grad_scaler;
  // A run stopped by SIGINT/SIGTERM mid-epoch: where in epoch `epoch` (0-based, the one after
  // those completed) it stopped and the epoch's running sums, {"batch", "loss_sum", "correct",
  // "seen", "seconds", "skipped_before"}, so a resume finishes that epoch exactly as the
  // uninterrupted run would have. Null for checkpoints written at the end of an epoch.
  nlohmann::json partial_epoch;
};

struct Checkpoint {
  NamedTensors model, optimizer;
  CheckpointState state;
};

// `optimizer` may be null (a bare model export).
void save_checkpoint(const std::string& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointState& state);
// duet::Error naming the file when it is missing, broken or not a duet checkpoint.
Checkpoint read_checkpoint(const std::string& path);
// Whether a safetensors file is a duet checkpoint (else: bare weights, e.g. a torchvision export).
bool is_checkpoint(const SafetensorsFile& f);
// The model tensors of either kind of file: a checkpoint's "model." entries without the prefix,
// or a bare weights file as it is.
NamedTensors model_tensors(const SafetensorsFile& f);

}  // namespace duet::app
