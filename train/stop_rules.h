// When a training run stops before its last step, decided in one place: a non-finite loss (the
// run fails, before the update), a signal (SIGINT or SIGTERM: a checkpoint to resume from), the
// time budget (--stop-after-minutes) and the epoch budget (--stop-after-epochs). In a
// data-parallel run every rank must stop at the same step, so the ranks' votes travel in the one
// collective each step already makes for its loss and accuracy, and once more after each epoch.
#pragma once
#include <cstdint>
#include "distributed/communicator.h"

namespace duet::app {

enum class Stop { none, signal, time_budget, epoch_budget };

// One step's results, summed over all ranks when data-parallel.
struct StepTotals {
  double loss = 0;  // the global batch's mean
  int64_t correct = 0, n = 0;
};

class StopRules {
public:
  // stop_after_minutes <= 0 and stop_after_epochs <= 0: no budget.
  StopRules(double stop_after_minutes, int64_t stop_after_epochs, dist::Communicator& comm);

  // Before the update: this rank's loss, hits and images (n), and its votes (a signal seen, or
  // the budget spent at `run_seconds` of training), summed over the ranks in one collective
  // ("comm.step_metrics") so that every rank sees the same loss and the same votes. In one
  // process the step's own numbers, and the votes are taken after the step instead (after_step).
  StepTotals agree_on_step(double loss, int64_t correct, int64_t n, double run_seconds);
  // A loss that is NaN or infinite ends the run before the update (agreed: the global mean).
  static bool bad_loss(const StepTotals& t);
  // After the step and its callbacks, when the epoch has more steps: stop now? One process reads
  // the signal flag and the clock (`run_seconds` of training); ranks use agree_on_step's votes.
  Stop after_step(double run_seconds) const;
  // After an epoch's evaluation, when more epochs follow: stop before the next? The budgets and
  // the signal, agreed over the ranks in one collective. epochs_run: epochs done by this run
  // (not counting those of a resumed checkpoint).
  Stop after_epoch(double train_seconds, int64_t epochs_run);

private:
  bool over_budget(double run_seconds) const { return budget_s_ > 0 && run_seconds >= budget_s_; }
  bool distributed() const { return comm_.size() > 1; }

  double budget_s_;
  int64_t epoch_budget_;
  dist::Communicator& comm_;
  bool signal_vote_ = false, budget_vote_ = false;  // the latest agree_on_step's, over all ranks
};

}  // namespace duet::app
