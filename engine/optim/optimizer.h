// Optimizers with PyTorch's semantics: parameter groups with their own hyper-parameters, lazily
// created per-parameter state (counted as optimizer_state memory), and one fused kernel per
// parameter per step (sgd_step_ / adam_step_ in engine/functional.h).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include "engine/tensor.h"

namespace duet::optim {

// One set of parameters sharing hyper-parameters. Each optimizer reads the fields it uses.
struct ParamGroup {
  std::vector<Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0.0;
  double momentum = 0.0, dampening = 0.0;  // SGD
  bool nesterov = false;                   // SGD
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam, AdamW
};

struct SgdOptions {
  double lr = 0.01, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};
struct AdamOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
};
struct AdamWOptions {  // AdamW's default decay differs from Adam's, as in PyTorch
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

class Optimizer {
public:
  explicit Optimizer(std::vector<ParamGroup> groups);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual std::string name() const = 0;  // "sgd", "adam", "adamw"

  // Updates every parameter that has a gradient (frozen parameters have none and are skipped).
  // Runs outside autograd, timed under the optimizer phase.
  void step();
  // Drops all gradients (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();

  // The first group's learning rate; set_lr sets every group's (what a schedule does).
  double lr() const;
  void set_lr(double lr);
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void add_param_group(ParamGroup g);
  int64_t steps() const { return steps_; }  // step() calls so far

  // Checkpointing. Parameters are numbered across groups in order (PyTorch's state_dict ids);
  // names are "state.<index>.<buffer>" (momentum_buffer, exp_avg, exp_avg_sq), "state.<index>.step"
  // (i64 scalar) and "steps" (i64 scalar). Buffer tensors are the live state, not copies.
  std::vector<std::pair<std::string, Tensor>> state_tensors() const;
  // Restores what state_tensors() produced (for the same parameter list): copies values in,
  // creating state where missing. Unknown names and shape mismatches are errors.
  void load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state);
  // What state_tensors() holds once every trainable parameter has been stepped: "steps", and per
  // trainable parameter its buffers and "state.<index>.step". A resume checks its file against
  // this, so that a missing buffer is an error instead of silently zeroed momentum.
  std::vector<std::string> stepped_state_names() const;
  int64_t state_bytes() const;

protected:
  struct ParamState {
    std::vector<std::pair<std::string, Tensor>> tensors;  // in state_names() order once created
    int64_t step = 0;
    bool empty() const { return tensors.empty(); }
  };
  // The state tensors a parameter has under group g (an empty list: none).
  virtual std::vector<std::string> state_names(const ParamGroup& g) const = 0;
  // One parameter with a defined gradient of its dtype and shape.
  virtual void update(const ParamGroup& g, const Tensor& param, const Tensor& grad, ParamState& s) = 0;
  // Zero-filled state like param (its layout too), allocated as optimizer_state memory.
  static Tensor new_state(const Tensor& param);
  static void check_group(const ParamGroup& g, size_t index);

private:
  ParamState& state_at(int64_t flat_index, const Tensor** param);
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // parallel to groups_[g].params
  int64_t steps_ = 0;
};

// SGD with momentum, dampening, Nesterov momentum and L2 weight decay (torch.optim.SGD).
class SGD final : public Optimizer {
public:
  SGD(std::vector<Tensor> params, SgdOptions o);
  explicit SGD(std::vector<ParamGroup> groups);
  std::string name() const override { return "sgd"; }
protected:
  std::vector<std::string> state_names(const ParamGroup& g) const override;
  void update(const ParamGroup& g, const Tensor& param, const Tensor& grad, ParamState& s) override;
};

// Adam (L2 decay folded into the gradient) and AdamW (decoupled decay), as torch.optim.
class Adam : public Optimizer {
public:
  Adam(std::vector<Tensor> params, AdamOptions o);
  Adam(std::vector<ParamGroup> groups, bool decoupled = false);
  std::string name() const override { return decoupled_ ? "adamw" : "adam"; }
protected:
  std::vector<std::string> state_names(const ParamGroup& g) const override;
  void update(const ParamGroup& g, const Tensor& param, const Tensor& grad, ParamState& s) override;
private:
  bool decoupled_;
};

class AdamW final : public Adam {
public:
  AdamW(std::vector<Tensor> params, AdamWOptions o);
  explicit AdamW(std::vector<ParamGroup> groups) : Adam(std::move(groups), true) {}
};

}  // namespace duet::optim
