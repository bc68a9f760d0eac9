// The loss-scaling policy and the tensor work around it (scale the loss, unscale and check the
// gradients), written with the public ops so it runs on any backend.
#include "engine/optim/grad_scaler.h"
#include <cmath>
#include "engine/autograd.h"
#include "engine/functional.h"
#include "engine/optim/optimizer.h"
#include "engine/profiler/events.h"

namespace duet::optim {

GradScaler::GradScaler() : GradScaler(Options{}) {}

GradScaler::GradScaler(const Options& o) : opts_(o), scale_(o.init_scale) {
  DUET_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "GradScaler: init_scale must be positive and finite, got {}",
             o.init_scale);
  DUET_CHECK(o.growth_factor > 1.0, "GradScaler: growth_factor must be > 1, got {}", o.growth_factor);
  DUET_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "GradScaler: backoff_factor must be in (0, 1), got {}",
             o.backoff_factor);
  DUET_CHECK(o.growth_interval >= 1, "GradScaler: growth_interval must be >= 1, got {}", o.growth_interval);
}

bool GradScaler::update(bool found_inf) {
  if (!opts_.enabled) return true;
  if (found_inf) {
    scale_ *= opts_.backoff_factor;
    tracker_ = 0;
    ++skipped_;
    return false;
  }
  if (++tracker_ >= opts_.growth_interval) {
    const double grown = scale_ * opts_.growth_factor;
    if (std::isfinite(grown)) scale_ = grown;
    tracker_ = 0;
  }
  return true;
}

Tensor GradScaler::scale_loss(const Tensor& loss) const { return opts_.enabled ? mul(loss, scale_) : loss; }

bool GradScaler::unscale_grads(const std::vector<Tensor>& params) const {
  if (!opts_.enabled) return false;
  NoGradGuard no_grad;
  const double inv = inv_scale();
  std::vector<Tensor> maxima;  // one device scalar per gradient: max |g|
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    g.copy_(mul(g, inv));
    // max |g| is inf when an element is and NaN when one is (amax propagates NaN), without the
    // overflow to inf that a sum of large finite values could cause.
    maxima.push_back(amax(abs(g)).reshape({1}));
  }
  if (maxima.empty()) return false;
  return !std::isfinite(amax(cat(maxima, 0)).item());
}

bool GradScaler::step(Optimizer& optimizer) {
  if (!opts_.enabled) {
    optimizer.step();
    return true;
  }
  bool found_inf = false;
  {
    profiler::PhaseGuard phase(Phase::optimizer);
    std::vector<Tensor> params;
    for (const ParamGroup& g : optimizer.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
    found_inf = unscale_grads(params);
  }
  const bool run = update(found_inf);
  if (run) optimizer.step();
  return run;
}

void GradScaler::load_state(const State& s) {
  DUET_CHECK(s.scale > 0 && std::isfinite(s.scale), "GradScaler: a saved scale must be positive and finite, got {}", s.scale);
  DUET_CHECK(s.growth_tracker >= 0 && s.skipped_steps >= 0,
             "GradScaler: saved counters must be >= 0, got growth_tracker {} and skipped_steps {}", s.growth_tracker,
             s.skipped_steps);
  scale_ = s.scale;
  tracker_ = s.growth_tracker;
  skipped_ = s.skipped_steps;
}

}  // namespace duet::optim
