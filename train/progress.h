// What the trainer shows while an epoch runs: on a terminal a progress bar redrawn in place (at
// most ten times a second); otherwise nothing until the epoch's line, or a plain line every
// `every` steps, so logs and pipes stay readable.
#pragma once
#include <chrono>
#include <cstdint>
#include <iosfwd>
#include <string>
#include "train/train_callbacks.h"

namespace duet::app {

class Progress {
public:
  Progress(std::ostream& out, bool bar, int64_t every = 0);
  void begin_epoch(int64_t epoch, int64_t epochs, int64_t batches);
  // After a step: batches done in this epoch, running mean loss and accuracy, images per second.
  void update(int64_t done, double loss, double accuracy, double images_per_s, double lr);
  // Clears the bar (the caller then prints the epoch's line).
  void end_epoch();

  // The bar text alone, for tests: "[=====>    ] 45/100".
  static std::string bar_text(int64_t done, int64_t total, int width = 24);

private:
  std::ostream& out_;
  bool bar_;
  int64_t every_;
  int64_t epoch_ = 0, epochs_ = 0, batches_ = 0;
  std::chrono::steady_clock::time_point last_draw_{}, epoch_start_{};
  bool drawn_ = false;
};

// Whether stdout is a terminal (isatty).
bool stdout_is_terminal();

std::string mib(int64_t bytes);  // "12.3 MiB"

// The line printed after each epoch of `epochs`: losses, accuracies, speed, lr, peak memory, amp.
std::string epoch_line(const EpochMetrics& m, int64_t epochs);

// The trainer's display: Progress while an epoch runs, then the epoch's line.
class ProgressPrinter final : public TrainCallback {
public:
  ProgressPrinter(std::ostream& out, bool bar, int64_t every, int64_t epochs)
      : out_(out), progress_(out, bar, every), epochs_(epochs) {}
  void on_epoch_begin(int64_t epoch, int64_t batches) override { progress_.begin_epoch(epoch, epochs_, batches); }
  void on_step(const StepRecord& s, const EpochProgress& p) override {
    progress_.update(p.batches_done, p.mean_loss, p.accuracy, p.images_per_s, s.lr);
  }
  void on_epoch_steps_end() override { progress_.end_epoch(); }
  void on_epoch_end(const EpochMetrics& m) override;

private:
  std::ostream& out_;
  Progress progress_;
  int64_t epochs_;
};

}  // namespace duet::app
