// --tensorboard DIR: what a run shows in TensorBoard, written as event files
// (reports/event_file.h) into DIR; view it with `tensorboard --logdir DIR`. The x axis of every
// chart is the number of optimizer steps done.
//
//   step/loss, step/lr, step/time_ms, step/images_per_s, step/peak_memory_mib   after every step
//   epoch/<key>            every number of the epoch's --log object (train_loss, train_acc,
//                          test_loss, test_acc, lr, images_per_s, peak_memory_bytes, ...), and
//                          epoch/step_time_ms (the epoch's seconds over its steps)
//   weights/<parameter>, gradients/<parameter>   histograms every N steps and after each epoch
//   run/config             the run's configuration (text)
//   profile/...            with --profile: each profiled step's time, images/s and memory peak
//                          from the report, and its operator, layer and step tables (text)
//
// Only rank 0 of a data-parallel run writes (the parameters are the same on every rank).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <nlohmann/json.hpp>
#include "engine/device.h"
#include "engine/nn/module.h"
#include "reports/event_file.h"
#include "train/train_callbacks.h"

namespace duet::app {

// A histogram of each parameter ("weights/<name>") and of its gradient ("gradients/<name>"),
// where one exists, at `step`.
void write_histograms(profiler::EventFileWriter& w, const nn::Module& model, int64_t step);
// A profile report (duet.profile/1): profile/step_time_ms, profile/images_per_s and
// profile/peak_memory_mib at each profiled step (its index + 1), and the operator table, the layer
// table and the step breakdown with the memory summary as text at `step`.
void write_profile_summary(profiler::EventFileWriter& w, const nlohmann::json& report, int64_t step);
// The run's configuration as text ("run/config") at step 0.
void write_run_config(profiler::EventFileWriter& w, const nlohmann::json& run_config);
// `duet profile --tensorboard DIR`: a new event file in `dir` with the report's run config, its
// profile summary and the model's histograms, all at `step` (the steps run). Returns its path.
std::string write_profile_events(const std::string& dir, const nlohmann::json& report, const nn::Module& model,
                                 int64_t step);

// The training callback: scalars per step and per epoch, histograms every `histogram_every`
// steps (0: none) and at the end of each epoch.
class TensorBoardLog final : public TrainCallback {
public:
  TensorBoardLog(const std::string& dir, std::shared_ptr<nn::Module> model, Device device, int64_t histogram_every);
  void on_epoch_begin(int64_t epoch, int64_t batches) override;
  void on_step(const StepRecord& s, const EpochProgress& p) override;
  void on_epoch_end(const EpochMetrics& m) override;
  profiler::EventFileWriter& writer() { return writer_; }
  int64_t steps_done() const { return steps_done_; }

private:
  profiler::EventFileWriter writer_;
  std::shared_ptr<nn::Module> model_;
  Device device_;
  int64_t histogram_every_;
  int64_t steps_done_ = 0, batches_done_ = 0, last_histogram_ = -1;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace duet::app
