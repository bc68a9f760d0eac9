// torch.optim.Adam and AdamW: per-parameter step counts drive the bias correction, so a parameter
// that starts receiving gradients late is corrected from its own first step, as in PyTorch.
#include "engine/functional.h"
#include "engine/optim/optimizer.h"

namespace duet::optim {

namespace {
std::vector<ParamGroup> adam_groups(std::vector<ParamGroup> groups, const char* name) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    DUET_CHECK(g.beta1 >= 0 && g.beta1 < 1 && g.beta2 >= 0 && g.beta2 < 1,
               "{}: group {} has betas ({}, {}), expected each in [0, 1)", name, i, g.beta1, g.beta2);
    DUET_CHECK(g.eps >= 0, "{}: group {} has eps {}, expected >= 0", name, i, g.eps);
  }
  return groups;
}

ParamGroup group_of(std::vector<Tensor> params, double lr, double b1, double b2, double eps, double wd) {
  ParamGroup g;
  g.params = std::move(params);
  g.lr = lr;
  g.beta1 = b1;
  g.beta2 = b2;
  g.eps = eps;
  g.weight_decay = wd;
  return g;
}
}  // namespace

Adam::Adam(std::vector<Tensor> params, AdamOptions o)
    : Adam(std::vector<ParamGroup>{group_of(std::move(params), o.lr, o.beta1, o.beta2, o.eps, o.weight_decay)}) {}

Adam::Adam(std::vector<ParamGroup> groups, bool decoupled)
    : Optimizer(adam_groups(std::move(groups), decoupled ? "adamw" : "adam")), decoupled_(decoupled) {}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions o)
    : Adam(std::vector<ParamGroup>{group_of(std::move(params), o.lr, o.beta1, o.beta2, o.eps, o.weight_decay)}, true) {}

std::vector<std::string> Adam::state_names(const ParamGroup&) const { return {"exp_avg", "exp_avg_sq"}; }

void Adam::update(const ParamGroup& g, const Tensor& param, const Tensor& grad, ParamState& s) {
  if (s.empty()) {
    s.tensors.emplace_back("exp_avg", new_state(param));
    s.tensors.emplace_back("exp_avg_sq", new_state(param));
  }
  ++s.step;
  const AdamParams p{g.lr, g.beta1, g.beta2, g.eps, g.weight_decay, decoupled_, s.step};
  adam_step_(param, grad, s.tensors[0].second, s.tensors[1].second, p);
}

}  // namespace duet::optim
