// Dynamic loss scaling for mixed-precision training (PyTorch's GradScaler rules). f16 gradients
// underflow to zero below 6e-8, so the loss is multiplied by `scale` before backward and the
// gradients divided by it before the optimizer step. A step whose gradients hold an inf or NaN is
// skipped and the scale halved; after `growth_interval` clean steps in a row the scale doubles.
// Plain host code with no CUDA dependency (it could live in engine/); the policy is tested in
// tests/test_cuda_host.cpp without a GPU.
#pragma once
#include <cstdint>
#include <vector>
#include "engine/tensor.h"

namespace duet {

class LossScaler {
public:
  struct Options {
    double init_scale = 65536.0;  // 2^16, PyTorch's default
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int64_t growth_interval = 2000;
    bool enabled = true;  // disabled: scale stays 1 and every step runs
  };

  LossScaler();
  explicit LossScaler(const Options& o);

  double scale() const { return opts_.enabled ? scale_ : 1.0; }
  double inv_scale() const { return 1.0 / scale(); }
  // After the gradients of one step were checked: true when the optimizer step should run. A
  // non-finite gradient skips the step and multiplies the scale by backoff_factor; growth_interval
  // finite steps in a row multiply it by growth_factor (never to infinity).
  bool update(bool found_inf);

  int64_t growth_tracker() const { return tracker_; }  // finite steps since the last change
  int64_t skipped_steps() const { return skipped_; }
  const Options& options() const { return opts_; }

  // loss * scale(), the tensor to call backward() on.
  Tensor scale_loss(const Tensor& loss) const;
  // Divides every defined gradient of `params` by the scale, in place; returns whether any
  // gradient holds an inf or NaN (then the values are meaningless and update(true) must follow).
  bool unscale_grads(const std::vector<Tensor>& params) const;

private:
  Options opts_;
  double scale_;
  int64_t tracker_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace duet
