// The schedule formulas, written to match PyTorch's schedulers step for step.
#include "train/lr_schedule.h"
#include <algorithm>
#include <cmath>
#include <numbers>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "engine/error.h"

namespace duet::app {

namespace {
// torch.optim.lr_scheduler._annealing_cos: from start (pct 0) to end (pct 1) along half a cosine.
double annealing_cos(double start, double end, double pct) {
  return end + (start - end) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}
}  // namespace

std::vector<std::string> lr_schedule_kinds() { return {"constant", "step", "cosine", "onecycle"}; }

LrSchedule::LrSchedule(LrScheduleConfig c) : c_(std::move(c)) {
  const auto kinds = lr_schedule_kinds();
  DUET_CHECK(std::find(kinds.begin(), kinds.end(), c_.kind) != kinds.end(),
             "unknown learning-rate schedule '{}': expected constant, step, cosine or onecycle", c_.kind);
  DUET_CHECK(c_.base_lr > 0 && std::isfinite(c_.base_lr), "learning rate {}: expected a positive number", c_.base_lr);
  DUET_CHECK(c_.total_steps >= 0 && c_.warmup_steps >= 0, "lr schedule: total_steps {} and warmup_steps {} must be >= 0",
             c_.total_steps, c_.warmup_steps);
  DUET_CHECK(c_.warmup_start_factor >= 0 && c_.warmup_start_factor <= 1,
             "lr schedule: warm-up start factor {}: expected a value in [0, 1]", c_.warmup_start_factor);
  if (c_.kind == "step")
    DUET_CHECK(c_.step_size > 0 || !c_.milestones.empty(),
               "lr schedule 'step' needs a step size (--lr-step-epochs) or milestones (--lr-milestones)");
  if (c_.kind == "onecycle") {
    DUET_CHECK(c_.total_steps > 1, "lr schedule 'onecycle' needs at least 2 steps in total, got {}", c_.total_steps);
    DUET_CHECK(c_.pct_start > 0 && c_.pct_start < 1, "onecycle pct_start {}: expected a value in (0, 1)", c_.pct_start);
    DUET_CHECK(c_.div_factor >= 1 && c_.final_div_factor >= 1,
               "onecycle div_factor {} and final_div_factor {}: expected values >= 1", c_.div_factor,
               c_.final_div_factor);
    DUET_CHECK(c_.warmup_steps == 0, "lr schedule 'onecycle' has its own warm-up (pct_start); drop the warm-up");
  }
  if (c_.kind == "cosine")
    DUET_CHECK(c_.min_lr >= 0 && c_.min_lr <= c_.base_lr, "cosine min lr {}: expected a value in [0, lr={}]", c_.min_lr,
               c_.base_lr);
}

double LrSchedule::lr_at(int64_t step) const {
  const LrScheduleConfig& c = c_;
  if (c.total_steps > 0) step = std::min(step, c.total_steps - 1);
  step = std::max<int64_t>(step, 0);

  if (c.kind == "onecycle") {
    const double initial = c.base_lr / c.div_factor, final_lr = initial / c.final_div_factor;
    const double end_up = c.pct_start * static_cast<double>(c.total_steps) - 1.0;
    const double end_down = static_cast<double>(c.total_steps) - 1.0;
    const double s = static_cast<double>(step);
    if (s <= end_up) return annealing_cos(initial, c.base_lr, end_up > 0 ? s / end_up : 1.0);
    return annealing_cos(c.base_lr, final_lr, (s - end_up) / (end_down - end_up));
  }

  if (step < c.warmup_steps) {
    // LinearLR: factor goes from start_factor at step 0 to 1 at step warmup_steps.
    const double t = static_cast<double>(step) / static_cast<double>(c.warmup_steps);
    return c.base_lr * (c.warmup_start_factor + (1.0 - c.warmup_start_factor) * t);
  }
  const int64_t s = step - c.warmup_steps;
  if (c.kind == "step") {
    int64_t drops = 0;
    if (!c.milestones.empty()) {
      for (int64_t m : c.milestones) drops += s >= m;
    } else {
      drops = s / c.step_size;
    }
    return c.base_lr * std::pow(c.gamma, static_cast<double>(drops));
  }
  if (c.kind == "cosine") {
    const int64_t span = std::max<int64_t>(c.total_steps - c.warmup_steps, 1);
    return annealing_cos(c.base_lr, c.min_lr, static_cast<double>(s) / static_cast<double>(span));
  }
  return c.base_lr;
}

std::string LrSchedule::describe() const {
  const LrScheduleConfig& c = c_;
  std::string s;
  if (c.kind == "onecycle")
    s = fmt::format("onecycle(max {:g}, {} steps, pct_start {:g}, div {:g}, final div {:g})", c.base_lr, c.total_steps,
                    c.pct_start, c.div_factor, c.final_div_factor);
  else if (c.kind == "cosine")
    s = fmt::format("cosine({:g} -> {:g} over {} steps)", c.base_lr, c.min_lr, c.total_steps - c.warmup_steps);
  else if (c.kind == "step" && !c.milestones.empty())
    s = fmt::format("step({:g}, x{:g} at steps {})", c.base_lr, c.gamma, fmt::join(c.milestones, ","));
  else if (c.kind == "step")
    s = fmt::format("step({:g}, x{:g} every {} steps)", c.base_lr, c.gamma, c.step_size);
  else
    s = fmt::format("constant({:g})", c.base_lr);
  if (c.warmup_steps > 0 && c.kind != "onecycle")
    s += fmt::format(" after {} warm-up steps from {:g}", c.warmup_steps, c.base_lr * c.warmup_start_factor);
  return s;
}

}  // namespace duet::app
