// Dynamic loss scaling for f16 mixed-precision training, with PyTorch's GradScaler rules. f16 has
// 5 exponent bits: gradients below 6e-8 flush to zero and small ones lose their mantissa, so the
// loss is multiplied by `scale` (2^16 to start) before backward, which shifts every gradient of
// the f16 part of the network into f16's range, and the f32 master gradients are divided by it
// again before the optimizer step. A step whose gradients hold an inf or NaN (the scale was too
// large somewhere) is skipped and the scale halved; after `growth_interval` clean steps in a row
// the scale doubles, so it tracks the largest scale that does not overflow.
//
// bf16 needs none of this: it has f32's 8 exponent bits (range 1e-38 to 3e38), so gradients
// neither underflow nor overflow where f32 ones would not; only precision is lower, which scaling
// cannot fix. Trainers therefore use a disabled scaler (scale 1, every step runs) for bf16.
//
// Device-independent: the tensor work (scaling, unscaling, the finiteness check) goes through the
// public ops, so it runs on every backend, and the policy is plain host code.
#pragma once
#include <cstdint>
#include <vector>
#include "engine/tensor.h"

namespace duet::optim {

class Optimizer;

class GradScaler {
public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, PyTorch's default
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
    bool enabled = true;  // disabled: scale stays 1, nothing is checked and every step runs
  };
  // What a checkpoint keeps so that a resumed run continues with the same scale.
  struct State {
    double scale = 65536.0;
    int64_t growth_tracker = 0;  // clean steps since the scale last changed
    int64_t skipped_steps = 0;   // steps skipped so far
  };

  GradScaler();
  explicit GradScaler(const Options& o);

  bool enabled() const { return opts_.enabled; }
  double scale() const { return opts_.enabled ? scale_ : 1.0; }
  double inv_scale() const { return 1.0 / scale(); }

  // loss * scale(), the tensor to call backward() on (the loss itself when disabled).
  Tensor scale_loss(const Tensor& loss) const;
  // Divides every defined gradient of `params` by the scale, in place, and returns whether any
  // gradient holds an inf or NaN (then the values are meaningless and update(true) must follow).
  // Each gradient is reduced to max |g| on its device (a NaN or inf survives the max); those
  // scalars are combined by one more max and read back once: one host synchronisation per step.
  // Disabled: does nothing and returns false.
  bool unscale_grads(const std::vector<Tensor>& params) const;
  // After the gradients of one step were checked: true when the optimizer step should run. A
  // non-finite gradient skips the step and multiplies the scale by backoff_factor; growth_interval
  // finite steps in a row multiply it by growth_factor (never to infinity).
  bool update(bool found_inf);
  // The whole step after backward(): unscale the optimizer's gradients, run optimizer.step()
  // unless one is not finite, update the scale. Returns whether the optimizer step ran.
  bool step(Optimizer& optimizer);

  int64_t growth_tracker() const { return tracker_; }
  int64_t skipped_steps() const { return skipped_; }
  const Options& options() const { return opts_; }
  State state() const { return {scale_, tracker_, skipped_}; }
  void load_state(const State& s);  // duet::Error for a scale that is not positive and finite

private:
  Options opts_;
  double scale_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace duet::optim
