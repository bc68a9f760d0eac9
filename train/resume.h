// Resuming a run from its checkpoint (--resume): the checks that the checkpoint belongs to this
// run (model, data, batch size, seed, ranks, optimizer), that its counters fit this data's steps
// per epoch, and that no optimizer state is missing; then where the run continues. Every failed
// check is a duet::Error naming the file, what differs and what to do instead.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/optim/grad_scaler.h"
#include "train/checkpoint.h"

namespace duet::app {

// This run, as the trainer set it up, which the checkpoint must match.
struct ResumeTarget {
  nlohmann::json config;  // what a checkpoint of this run stores (Trainer::checkpoint_config)
  int world_size = 1;
  int64_t steps_per_epoch = 0;
  std::string optimizer;                         // --optimizer, for messages
  std::vector<std::string> optimizer_state;      // the tensors it keeps once it has stepped
  bool loss_scaling = false;                     // fp16: the scaler's state is restored
};

// Where the resumed run continues.
struct ResumePoint {
  int64_t epoch = 0, step = 0;  // epochs and optimizer steps done
  int64_t batch = 0;            // batches done of epoch `epoch` (an interrupted epoch), else 0
  nlohmann::json partial_epoch;  // that epoch's running sums, or null
  double train_seconds = 0;      // training time before this run
  std::optional<optim::GradScaler::State> grad_scaler;  // fp16: the loss scale the run had reached
};

// Checks `ck`, read from `path`, against `run` and returns where to continue. Prints a note to
// `out` when only the epoch count changed (the schedule is stretched to the new length).
ResumePoint check_resume(const std::string& path, const Checkpoint& ck, const ResumeTarget& run, std::ostream& out);

// "resumed from 'a.safetensors': 3 epochs (12 steps) done, test acc 71.20%".
std::string resumed_line(const std::string& path, const Checkpoint& ck, const ResumePoint& at, int64_t steps_per_epoch);

}  // namespace duet::app
