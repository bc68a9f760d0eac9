// The optimizer and schedule a TrainConfig describes, and what checkpoints store of it.
#include "train/train_config.h"
#include <cmath>
#include <fmt/format.h>
#include "engine/error.h"
#include "engine/optim/optimizer.h"

namespace duet::app {

double OptimConfig::resolved_lr() const { return lr.value_or(optimizer == "sgd" ? 0.05 : 2e-3); }

double OptimConfig::resolved_weight_decay() const {
  if (weight_decay) return *weight_decay;
  return optimizer == "sgd" ? 5e-4 : optimizer == "adamw" ? 0.01 : 0.0;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const OptimConfig& o, const std::vector<Tensor>& params) {
  const double lr = o.resolved_lr(), wd = o.resolved_weight_decay();
  DUET_CHECK(wd >= 0, "--weight-decay {}: expected 0 or more", wd);
  DUET_CHECK(o.label_smoothing >= 0 && o.label_smoothing < 1, "--label-smoothing {}: expected a value in [0, 1)",
             o.label_smoothing);
  if (o.optimizer == "sgd") {
    DUET_CHECK(!o.nesterov || o.momentum > 0, "--nesterov needs --momentum > 0 (got {})", o.momentum);
    return std::make_unique<optim::SGD>(
        params, optim::SgdOptions{.lr = lr, .momentum = o.momentum, .weight_decay = wd, .nesterov = o.nesterov});
  }
  if (o.optimizer == "adam") return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = lr, .weight_decay = wd});
  if (o.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = lr, .weight_decay = wd});
  throw Error(fmt::format("unknown optimizer '{}': expected sgd, adam or adamw", o.optimizer));
}

LrScheduleConfig make_schedule_config(const OptimConfig& o, int64_t epochs, int64_t steps_per_epoch) {
  // The command line refuses these already; a library caller or an edited checkpoint may not.
  const auto steps = [&](double e, const char* option) {
    DUET_CHECK(std::isfinite(e) && e >= 0 && e <= 1e6, "{} {}: expected a finite number of epochs in [0, 1e6]", option,
               e);
    return static_cast<int64_t>(std::llround(e * static_cast<double>(steps_per_epoch)));
  };
  for (const auto& [value, option] : {std::pair{o.gamma, "--lr-gamma"}, {o.min_lr, "--min-lr"},
                                      {o.warmup_start_factor, "--warmup-start"}, {o.pct_start, "--pct-start"},
                                      {o.div_factor, "--div-factor"}, {o.final_div_factor, "--final-div-factor"},
                                      {o.resolved_lr(), "--lr"}})
    DUET_CHECK(std::isfinite(value), "{} {}: expected a finite number", option, value);
  LrScheduleConfig s;
  s.kind = o.schedule;
  s.base_lr = o.resolved_lr();
  s.total_steps = epochs * steps_per_epoch;
  s.warmup_steps = steps(o.warmup_epochs, "--warmup-epochs");
  s.warmup_start_factor = o.warmup_start_factor;
  s.step_size = steps(o.step_epochs, "--lr-step-epochs");
  for (double m : o.milestone_epochs) s.milestones.push_back(steps(m, "--lr-milestones") - s.warmup_steps);
  s.gamma = o.gamma;
  s.min_lr = o.min_lr;
  s.pct_start = o.pct_start;
  s.div_factor = o.div_factor;
  s.final_div_factor = o.final_div_factor;
  return s;
}

nlohmann::json stored_config(const TrainConfig& c) {
  nlohmann::json j = c;
  j["optim"]["lr"] = c.optim.resolved_lr();
  j["optim"]["weight_decay"] = c.optim.resolved_weight_decay();
  return j;
}

}  // namespace duet::app
