// Everything a training run is configured by, as one value: model, data, optimizer, schedule,
// files. It is stored (as JSON) in every checkpoint, so `duet eval`, `duet predict` and
// `--resume` rebuild exactly what was trained.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "train/json_optional.h"
#include "train/lr_schedule.h"
#include "train/model_setup.h"
#include "train/train_data.h"
#include "engine/tensor.h"

namespace duet::optim {
class Optimizer;
}

namespace duet::app {

struct OptimConfig {
  std::string optimizer = "sgd";  // sgd | adam | adamw
  std::optional<double> lr;       // default: 0.05 sgd, 0.002 adam/adamw (onecycle: the peak)
  double momentum = 0.9;
  bool nesterov = false;
  std::optional<double> weight_decay;  // default: 5e-4 sgd, 0 adam, 0.01 adamw (torch's)
  double label_smoothing = 0.0;
  std::string schedule = "constant";  // constant | step | cosine | onecycle
  double warmup_epochs = 0;           // linear warm-up (not with onecycle)
  double warmup_start_factor = 0.0;
  double step_epochs = 0;                   // step: decay every this many epochs ...
  std::vector<double> milestone_epochs;     // ... or at these epochs
  double gamma = 0.1;
  double min_lr = 0.0;     // cosine floor
  double pct_start = 0.3;  // onecycle
  double div_factor = 25.0, final_div_factor = 1e4;

  double resolved_lr() const;
  double resolved_weight_decay() const;
};

struct TrainConfig {
  ModelConfig model;
  DataOptions data;
  OptimConfig optim;
  int64_t epochs = 3;
  int64_t batch = 64;
  uint64_t seed = 0;
  std::string checkpoint;  // written after every epoch (atomically)
  std::string resume;      // a checkpoint to continue from
  std::string init_from;   // weights to start from (transfer learning)
  bool freeze_backbone = false;
  std::string log;  // JSONL, one object per epoch (a new run starts it afresh, a resumed one appends)
  std::string tensorboard;               // TensorBoard event files into this folder (train/tensorboard_log.h)
  int64_t tensorboard_histograms = 100;  // with it: weight and gradient histograms every N steps (0: none)
  // Mixed precision: off | bf16 | fp16 (autocast of conv/linear/matmul with f32 master weights;
  // fp16 adds dynamic loss scaling). See docs/training.md.
  std::string amp = "off";
  bool profile = false;
  bool profile_sync = false;  // per-op profile of CUDA: synchronise per op instead of CUDA events
  std::string profile_path, trace_path;
  std::string profile_mode = "per-op";  // per-op | throughput
  double stop_after_minutes = 0;        // > 0: stop once this much training time has passed
  int64_t stop_after_epochs = 0;        // > 0: stop after this many epochs of this run (resume later)
  int64_t log_every = 0;                // plain progress line every N steps when stdout is not a terminal
  // Data-parallel runs (under mpirun): MB of gradients per all-reduce bucket. Not stored in
  // checkpoints: it changes timing, not results.
  double bucket_mb = 25.0;
  // Data-parallel runs: batch norm statistics over all ranks' batches (SyncBatchNorm). Changes
  // results, so it is stored in checkpoints (as "sync_bn" when set).
  bool sync_bn = false;
  // Data-parallel runs: a collective still waiting after this many seconds ends the job (a hung
  // or stopped rank). Not stored in checkpoints.
  double comm_timeout_s = 600;
};

// The run's configuration as checkpoints store it, under the names below; a missing key reads
// as the default. Files, profiling and the data-parallel transport settings are not stored: they
// change where results go or how fast they come, not the results.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(OptimConfig, optimizer, lr, momentum, nesterov, weight_decay,
                                                label_smoothing, schedule, warmup_epochs, warmup_start_factor,
                                                step_epochs, milestone_epochs, gamma, min_lr, pct_start, div_factor,
                                                final_div_factor)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(TrainConfig, model, data, optim, epochs, batch, seed, init_from,
                                                freeze_backbone, amp)
// What a checkpoint stores of c: the above, with the optimizer's defaults resolved (lr and weight
// decay), so the file says what ran.
nlohmann::json stored_config(const TrainConfig& c);

// The optimizer of the config over `params` (frozen ones are skipped at step time).
std::unique_ptr<optim::Optimizer> make_optimizer(const OptimConfig& o, const std::vector<Tensor>& params);
// Epoch-based settings turned into steps.
LrScheduleConfig make_schedule_config(const OptimConfig& o, int64_t epochs, int64_t steps_per_epoch);

}  // namespace duet::app
