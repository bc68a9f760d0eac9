// Learning-rate schedules as pure functions of the global step, so a resumed run only needs the
// step count to be back on the same curve. Kinds follow torch.optim.lr_scheduler: constant, step
// (StepLR), cosine (CosineAnnealingLR), onecycle (OneCycleLR, cosine annealing, two phases), each
// optionally after a linear warm-up (LinearLR from warmup_start_factor to 1).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace duet::app {

struct LrScheduleConfig {
  std::string kind = "constant";  // constant | step | cosine | onecycle
  double base_lr = 0.1;           // onecycle: the peak (max_lr)
  int64_t total_steps = 0;        // optimizer steps of the whole run
  int64_t warmup_steps = 0;       // linear warm-up from base_lr * warmup_start_factor (not for onecycle)
  double warmup_start_factor = 0.0;
  int64_t step_size = 0;          // step: multiply by gamma every step_size steps ...
  std::vector<int64_t> milestones;  // ... or at these steps (MultiStepLR) when not empty
  double gamma = 0.1;
  double min_lr = 0.0;            // cosine: eta_min
  double pct_start = 0.3;         // onecycle: fraction of the steps spent rising
  double div_factor = 25.0;       // onecycle: initial lr = max_lr / div_factor
  double final_div_factor = 1e4;  // onecycle: final lr = initial lr / final_div_factor
};

class LrSchedule {
public:
  // Throws duet::Error naming the field when the configuration is inconsistent.
  explicit LrSchedule(LrScheduleConfig c);
  // The learning rate of the optimizer step with 0-based index `step`. Steps past total_steps
  // keep the last value.
  double lr_at(int64_t step) const;
  const LrScheduleConfig& config() const { return c_; }
  std::string describe() const;  // "onecycle(max 0.1, 3900 steps, pct_start 0.25)"

private:
  LrScheduleConfig c_;
};

std::vector<std::string> lr_schedule_kinds();

}  // namespace duet::app
