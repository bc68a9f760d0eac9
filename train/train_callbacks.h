// What Trainer::fit() tells the parts of a run that watch it: the progress display, the JSONL log,
// a test's loss recorder, whatever a caller adds (Trainer::add_callback). In order:
//
//   on_epoch_begin -> on_step (after every optimizer step) -> on_epoch_steps_end -> on_epoch_end
//
// on_epoch_steps_end comes also when an epoch is cut short (a signal, the time budget, a
// non-finite loss), and then on_epoch_end does not. Callbacks watch and report; the loop keeps
// what has to happen in order and agree across ranks: the step itself, the stop decisions, the
// weights check and the checkpoints (on_epoch_end comes after the epoch's checkpoint is written).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <nlohmann/json.hpp>

namespace duet::app {

struct StepRecord {
  int64_t step = 0, epoch = 0, batch = 0;  // global step, epoch and batch within it (0-based)
  double loss = 0, lr = 0;                 // the global batch's mean loss (over all ranks)
};

// The epoch so far, after a step.
struct EpochProgress {
  int64_t batches_done = 0, batches = 0;  // in this epoch (a resumed epoch counts its earlier batches)
  double mean_loss = 0, accuracy = 0, images_per_s = 0;
};

struct EpochMetrics {
  int64_t epoch = 0;  // 1-based, as printed
  int64_t steps = 0;  // global steps done at the end of the epoch
  double lr = 0;      // the last step's
  double train_loss = 0, train_accuracy = 0;
  double test_loss = 0, test_accuracy = 0;
  // --val-fraction: the epoch was evaluated on the validation split (the test split is evaluated
  // once, at the end of the run: TrainResult::test); test_* are then not set, nor logged.
  bool has_val = false;
  double val_loss = 0, val_accuracy = 0;
  double images_per_s = 0, epoch_seconds = 0, eval_seconds = 0;
  double train_seconds = 0;  // training time of the whole run so far (resumed runs included)
  int64_t peak_memory_bytes = 0;
  std::string amp = "off";     // --amp
  int64_t skipped_steps = 0;   // fp16: optimizer steps of this epoch skipped for inf/NaN gradients
  double loss_scale = 1.0;     // fp16: the loss scale at the end of the epoch
  bool time_budget_reached = false;  // --stop-after-minutes ended the epoch before its last batch
  nlohmann::json to_json() const;    // the JSONL log's object (time_budget_reached is not in it)
};

class TrainCallback {
public:
  virtual ~TrainCallback() = default;
  virtual void on_epoch_begin(int64_t /*epoch, 0-based*/, int64_t /*batches*/) {}
  virtual void on_step(const StepRecord&, const EpochProgress&) {}
  virtual void on_epoch_steps_end() {}
  virtual void on_epoch_end(const EpochMetrics&) {}
};

// Calls a function after every step (tests record the loss curve with it).
class StepHook final : public TrainCallback {
public:
  explicit StepHook(std::function<void(const StepRecord&)> f) : f_(std::move(f)) {}
  void on_step(const StepRecord& s, const EpochProgress&) override { f_(s); }

private:
  std::function<void(const StepRecord&)> f_;
};

// --log: one JSON object per epoch appended to the file, one write per line, so a reader never sees
// half an object. A new run starts the file afresh (start_new()), a resumed one appends.
class EpochLog final : public TrainCallback {
public:
  explicit EpochLog(std::string path) : path_(std::move(path)) {}
  void start_new() const;
  void on_epoch_end(const EpochMetrics& m) override;

private:
  std::string path_;
};

}  // namespace duet::app
