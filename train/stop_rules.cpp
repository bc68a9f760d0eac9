// The stop decisions of a training run (see stop_rules.h).
#include "train/stop_rules.h"
#include <cmath>
#include "engine/profiler/events.h"
#include "train/interrupt.h"

namespace duet::app {

StopRules::StopRules(double stop_after_minutes, int64_t stop_after_epochs, dist::Communicator& comm)
    : budget_s_(stop_after_minutes * 60.0), epoch_budget_(stop_after_epochs), comm_(comm) {}

StepTotals StopRules::agree_on_step(double loss, int64_t correct, int64_t n, double run_seconds) {
  StepTotals t{.loss = loss, .correct = correct, .n = n};
  if (!distributed()) return t;
  double v[5] = {loss * static_cast<double>(n), static_cast<double>(n), static_cast<double>(correct),
                 interrupt_signal() != 0 ? 1.0 : 0.0, over_budget(run_seconds) ? 1.0 : 0.0};
  {
    profiler::PhaseGuard phase(Phase::comm);
    profiler::CommScope op("comm.step_metrics", comm_.transport(Device::cpu()), {}, [] { return OpCost{}; });
    comm_.all_reduce_sum(v, 5);
  }
  t.loss = v[0] / v[1];
  t.n = static_cast<int64_t>(v[1]);
  t.correct = static_cast<int64_t>(v[2]);
  signal_vote_ = v[3] > 0;
  budget_vote_ = v[4] > 0;
  return t;
}

bool StopRules::bad_loss(const StepTotals& t) { return !std::isfinite(t.loss); }

Stop StopRules::after_step(double run_seconds) const {
  const bool signal = distributed() ? signal_vote_ : interrupt_signal() != 0;
  const bool budget = distributed() ? budget_vote_ : over_budget(run_seconds);
  return signal ? Stop::signal : budget ? Stop::time_budget : Stop::none;
}

Stop StopRules::after_epoch(double train_seconds, int64_t epochs_run) {
  double v[2] = {over_budget(train_seconds) ? 1.0 : 0.0, interrupt_signal() != 0 ? 1.0 : 0.0};
  if (distributed()) comm_.all_reduce_sum(v, 2);
  if (v[0] > 0) return Stop::time_budget;
  if (v[1] > 0) return Stop::signal;
  if (epoch_budget_ > 0 && epochs_run >= epoch_budget_) return Stop::epoch_budget;
  return Stop::none;
}

}  // namespace duet::app
