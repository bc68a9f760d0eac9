// The loss-scaling policy and the two tensor helpers around it (scale the loss, unscale and check
// the gradients), written with the public ops so they run on any backend.
#include "backends/cuda/loss_scaler.h"
#include <cmath>
#include "engine/autograd.h"
#include "engine/functional.h"

namespace duet {

LossScaler::LossScaler() : LossScaler(Options{}) {}

LossScaler::LossScaler(const Options& o) : opts_(o), scale_(o.init_scale) {
  DUET_CHECK(o.init_scale > 0 && std::isfinite(o.init_scale), "LossScaler: init_scale must be positive and finite, got {}",
             o.init_scale);
  DUET_CHECK(o.growth_factor > 1.0, "LossScaler: growth_factor must be > 1, got {}", o.growth_factor);
  DUET_CHECK(o.backoff_factor > 0.0 && o.backoff_factor < 1.0, "LossScaler: backoff_factor must be in (0, 1), got {}",
             o.backoff_factor);
  DUET_CHECK(o.growth_interval >= 1, "LossScaler: growth_interval must be >= 1, got {}", o.growth_interval);
}

bool LossScaler::update(bool found_inf) {
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

Tensor LossScaler::scale_loss(const Tensor& loss) const { return opts_.enabled ? mul(loss, scale_) : loss; }

bool LossScaler::unscale_grads(const std::vector<Tensor>& params) const {
  NoGradGuard no_grad;
  bool found_inf = false;
  const double inv = inv_scale();
  for (const Tensor& p : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    if (opts_.enabled) g.copy_(mul(g, inv));
    // amax(|g|) is inf when any element is, and NaN when any is (amax propagates NaN), without the
    // overflow a sum could cause.
    if (g.numel() > 0 && !std::isfinite(amax(abs(g)).item())) found_inf = true;
  }
  return found_inf;
}

}  // namespace duet
