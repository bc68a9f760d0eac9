// The training loop: epochs of shuffled batches from the loader, forward, loss (with label
// smoothing), backward and the optimizer step at the schedule's learning rate; evaluation, metrics
// and an atomic checkpoint after every epoch; exact resume; a stop with a clear message when the
// loss stops being finite; mixed precision (--amp: autocast, and dynamic loss scaling for fp16).
// The profiler marks each step and phase. What watches the run (the progress display, the JSONL
// log, a caller's hooks) is a list of callbacks (train/train_callbacks.h); when to stop early is
// StopRules' (train/stop_rules.h); what a resume checks is train/resume.h's.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/lr_schedule.h"
#include "train/run_env.h"
#include "train/stop_rules.h"
#include "train/train_callbacks.h"
#include "train/train_config.h"
#include "train/train_data.h"
#include "train/val_split.h"
#include "distributed/communicator.h"
#include "distributed/grad_reducer.h"
#include "engine/nn/module.h"
#include "engine/optim/grad_scaler.h"

namespace duet::optim {
class Optimizer;
}
namespace duet::datasets {
class DataLoader;
}

namespace duet::app {

struct TrainResult {
  std::vector<EpochMetrics> epochs;  // those run by this call
  int64_t steps = 0;                 // global steps done
  double train_seconds = 0;
  bool stopped_early = false;        // --stop-after-minutes
  int interrupted_by = 0;            // SIGINT or SIGTERM stopped the run (see train/interrupt.h)
  // --val-fraction: the test split's one evaluation, when the run ended (all epochs, or the time
  // budget; not a stop to be resumed) with the best epoch on validation's weights (val_split.h).
  std::optional<TestReport> test;
};

class Trainer {
public:
  // `model` is built for `data` (classes, image size) and initialised (init_from done); it moves
  // to env.device here. The checkpoint stores `config` (with data's classes and transform).
  //
  // Data-parallel (comm.size() > 1): every rank builds the Trainer with the same config; rank 0's
  // weights and buffers are broadcast, each rank trains on its shard of every global batch
  // (config.batch per rank; the epoch's remainder that does not fill a global batch is dropped),
  // gradients are averaged in buckets during backward, evaluation is sharded and its sums
  // all-reduced, and only rank 0 writes checkpoints and the log (out should be a null stream on
  // the others).
  Trainer(TrainConfig config, RunEnv env, TrainData data, std::shared_ptr<nn::Module> model, std::ostream& out,
          dist::Communicator& comm = dist::world());
  ~Trainer();

  // Runs epochs [start, config.epochs), where start is 0 or the resumed checkpoint's epoch (from
  // the batch it stopped at, for a checkpoint written on an interrupt). Throws duet::Error on a
  // non-finite loss or non-finite weights, naming the step and the last good checkpoint. When
  // interrupt_signal() is set between steps it writes a checkpoint (if configured) and returns
  // with interrupted_by set.
  TrainResult fit();

  // Added after the trainer's own (the progress display on `out`, then --log's EpochLog), and
  // called in the order added.
  void add_callback(std::shared_ptr<TrainCallback> cb) { callbacks_.push_back(std::move(cb)); }
  bool progress_bar = false;  // a bar redrawn in place, for a terminal (else --log-every lines)

  nn::Module& model() { return *model_; }
  optim::Optimizer& optimizer() { return *opt_; }
  const optim::GradScaler& grad_scaler() const { return scaler_; }
  const LrSchedule& schedule() const { return *schedule_; }
  int64_t steps_per_epoch() const { return steps_per_epoch_; }
  // The input layout of the run, decided once from --memory-format and the device: the loader
  // makes batches in it, the evaluation uses it, checkpoints and reports name it.
  MemoryFormat memory_format() const { return format_; }
  bool distributed() const { return comm_.size() > 1; }
  const dist::GradReducer* reducer() const { return reducer_.get(); }
  int sync_bn_layers() const { return sync_bn_layers_; }  // --sync-bn: the batch norms synchronised
  // The newest checkpoint known good ("" when none): written by this run or resumed from.
  const std::string& last_checkpoint() const { return last_checkpoint_; }
  // The config as stored in checkpoints: TrainConfig plus image size, class names, eval transform.
  nlohmann::json checkpoint_config() const;

private:
  // The running sums of an epoch: its metrics, and what a mid-epoch checkpoint stores to continue it.
  struct EpochSums {
    size_t first_batch = 0;  // a resumed epoch's first batch
    double loss_sum = 0, seconds_before = 0;
    int64_t correct = 0, seen = 0, skipped_before = 0;
    void add(const StepTotals& o) {
      loss_sum += o.loss * static_cast<double>(o.n);
      correct += o.correct;
      seen += o.n;
    }
    EpochProgress progress(size_t batches_done, size_t batches, double seconds) const {
      return {static_cast<int64_t>(batches_done), static_cast<int64_t>(batches),
              loss_sum / static_cast<double>(seen), static_cast<double>(correct) / static_cast<double>(seen),
              static_cast<double>(seen) / seconds};
    }
  };
  // Data, forward, loss (a non-finite one stops the run), backward and the optimizer's update of
  // batch k of `batches` (n images on this rank), `run_seconds` into the run's training time.
  StepTotals train_step(int64_t epoch, size_t k, size_t batches, int64_t n, double run_seconds);
  EpochSums begin_epoch(int64_t epoch);
  // A signal between two steps: the checkpoint that finishes epoch `epoch` from next_batch on --resume.
  void save_interrupted_epoch(int64_t epoch, size_t next_batch, const EpochSums& sums, double elapsed,
                              double train_seconds);
  // The epoch's end: its metrics, the evaluation, its checkpoint (not when cut short by the time
  // budget: it would resume at the wrong step), the callbacks.
  EpochMetrics end_epoch(int64_t epoch, const EpochSums& s, double secs, double train_seconds, bool cut_short,
                         const EvalSetup& eval_setup);
  nlohmann::json partial_epoch_state(size_t next_batch, const EpochSums& s, double elapsed) const;
  void start_callbacks();
  void each_callback(const std::function<void(TrainCallback&)>& f);
  // The signal that stopped the run: this rank's, or SIGTERM for another rank's.
  int stopped_by_signal() const;
  // The line printed when the run stops early (mid_epoch: a signal between two steps of `epoch`).
  std::string stop_note(Stop why, int64_t epoch, double train_seconds, bool mid_epoch) const;

  void resume_from(const std::string& path);
  void write_checkpoint(int64_t epochs_done, const EpochMetrics& m, const nlohmann::json& partial_epoch = nullptr);
  void write_best_checkpoint(const EpochMetrics& m);  // --val-fraction with --checkpoint (val_split.h)
  CheckpointState checkpoint_state(int64_t epochs_done, const EpochMetrics& m) const;  // what both write
  // duet::Error naming the parameter when a weight is NaN or infinite after the update of
  // `epoch`'s batch `batch`: the loss check before each update cannot see the last one.
  void check_weights_finite(int64_t epoch, int64_t batch) const;
  [[noreturn]] void stop_on_bad_loss(double loss, int64_t epoch, int64_t batch) const;
  std::string last_good_checkpoint() const;

  TrainConfig c_;
  RunEnv env_;
  TrainData data_;
  std::shared_ptr<nn::Module> model_;
  std::ostream& out_;
  dist::Communicator& comm_;
  std::unique_ptr<dist::GradReducer> reducer_;  // data-parallel runs only
  int sync_bn_layers_ = 0;
  MemoryFormat format_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::optional<DType> amp_;  // --amp: the dtype conv/linear/matmul autocast to
  optim::GradScaler scaler_;  // enabled for fp16 only (bf16 needs no loss scaling)
  StopRules stops_;
  std::unique_ptr<datasets::DataLoader> loader_;
  std::unique_ptr<LrSchedule> schedule_;
  int64_t steps_per_epoch_ = 0;
  int64_t start_epoch_ = 0, step_ = 0;
  double train_seconds_before_ = 0;  // from the resumed checkpoint
  std::string last_checkpoint_;      // the newest checkpoint known good (written or resumed from)
  int64_t last_checkpoint_epoch_ = 0;
  nlohmann::json resume_partial_;  // the resumed checkpoint's partial_epoch (null: start at a batch 0)
  std::vector<std::shared_ptr<TrainCallback>> callbacks_;  // added by the caller
  std::vector<std::shared_ptr<TrainCallback>> active_;     // fit()'s: the trainer's own, then the caller's
  BestOnValidation best_;  // --val-fraction: the best epoch so far on the validation split
};

}  // namespace duet::app
