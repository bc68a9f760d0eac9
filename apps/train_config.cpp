// TrainConfig <-> JSON, and the optimizer and schedule it describes.
#include "apps/train_config.h"
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

nlohmann::json to_json(const TrainConfig& c) {
  const OptimConfig& o = c.optim;
  nlohmann::json optim{{"optimizer", o.optimizer},
                       {"lr", o.resolved_lr()},
                       {"momentum", o.momentum},
                       {"nesterov", o.nesterov},
                       {"weight_decay", o.resolved_weight_decay()},
                       {"label_smoothing", o.label_smoothing},
                       {"schedule", o.schedule},
                       {"warmup_epochs", o.warmup_epochs},
                       {"warmup_start_factor", o.warmup_start_factor},
                       {"step_epochs", o.step_epochs},
                       {"milestone_epochs", o.milestone_epochs},
                       {"gamma", o.gamma},
                       {"min_lr", o.min_lr},
                       {"pct_start", o.pct_start},
                       {"div_factor", o.div_factor},
                       {"final_div_factor", o.final_div_factor}};
  return {{"model", to_json(c.model)},
          {"data", to_json(c.data)},
          {"optim", optim},
          {"epochs", c.epochs},
          {"batch", c.batch},
          {"seed", c.seed},
          {"init_from", c.init_from},
          {"freeze_backbone", c.freeze_backbone},
          {"amp", c.amp}};
}

TrainConfig train_config_from_json(const nlohmann::json& j) {
  TrainConfig c;
  if (j.contains("model")) c.model = model_config_from_json(j["model"]);
  if (j.contains("data")) c.data = data_options_from_json(j["data"]);
  c.epochs = j.value("epochs", c.epochs);
  c.batch = j.value("batch", c.batch);
  c.seed = j.value("seed", c.seed);
  c.init_from = j.value("init_from", c.init_from);
  c.freeze_backbone = j.value("freeze_backbone", c.freeze_backbone);
  c.amp = j.value("amp", c.amp);
  if (j.contains("optim")) {
    const nlohmann::json& o = j["optim"];
    OptimConfig& p = c.optim;
    p.optimizer = o.value("optimizer", p.optimizer);
    if (o.contains("lr")) p.lr = o["lr"].get<double>();
    p.momentum = o.value("momentum", p.momentum);
    p.nesterov = o.value("nesterov", p.nesterov);
    if (o.contains("weight_decay")) p.weight_decay = o["weight_decay"].get<double>();
    p.label_smoothing = o.value("label_smoothing", p.label_smoothing);
    p.schedule = o.value("schedule", p.schedule);
    p.warmup_epochs = o.value("warmup_epochs", p.warmup_epochs);
    p.warmup_start_factor = o.value("warmup_start_factor", p.warmup_start_factor);
    p.step_epochs = o.value("step_epochs", p.step_epochs);
    if (o.contains("milestone_epochs")) p.milestone_epochs = o["milestone_epochs"].get<std::vector<double>>();
    p.gamma = o.value("gamma", p.gamma);
    p.min_lr = o.value("min_lr", p.min_lr);
    p.pct_start = o.value("pct_start", p.pct_start);
    p.div_factor = o.value("div_factor", p.div_factor);
    p.final_div_factor = o.value("final_div_factor", p.final_div_factor);
  }
  return c;
}

}  // namespace duet::app
