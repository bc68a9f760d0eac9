// torch.optim.SGD: the first momentum step sets the buffer to the gradient (no dampening), later
// steps blend it in; the arithmetic is in the sgd_step kernel.
#include "engine/functional.h"
#include "engine/optim/optimizer.h"

namespace duet::optim {

namespace {
std::vector<ParamGroup> sgd_groups(std::vector<ParamGroup> groups) {
  for (size_t i = 0; i < groups.size(); ++i) {
    const ParamGroup& g = groups[i];
    DUET_CHECK(g.momentum >= 0, "sgd: group {} has momentum {}, expected >= 0", i, g.momentum);
    DUET_CHECK(!g.nesterov || (g.momentum > 0 && g.dampening == 0),
               "sgd: group {} uses Nesterov momentum with momentum={} and dampening={}: expected momentum > 0 and "
               "dampening == 0",
               i, g.momentum, g.dampening);
  }
  return groups;
}
}  // namespace

SGD::SGD(std::vector<Tensor> params, SgdOptions o)
    : SGD(std::vector<ParamGroup>{ParamGroup{std::move(params), o.lr, o.weight_decay, o.momentum, o.dampening,
                                             o.nesterov}}) {}

SGD::SGD(std::vector<ParamGroup> groups) : Optimizer(sgd_groups(std::move(groups))) {}

std::vector<std::string> SGD::state_names(const ParamGroup& g) const {
  if (g.momentum == 0.0) return {};
  return {"momentum_buffer"};
}

void SGD::update(const ParamGroup& g, const Tensor& param, const Tensor& grad, ParamState& s) {
  const SgdParams p{g.lr, g.momentum, g.dampening, g.weight_decay, g.nesterov};
  Tensor buf;
  bool first = false;
  if (g.momentum != 0.0) {
    if (s.empty()) {
      s.tensors.emplace_back("momentum_buffer", new_state(param));
      first = true;
    }
    buf = s.tensors[0].second;
  }
  sgd_step_(param, grad, buf, p, first);
  ++s.step;
}

}  // namespace duet::optim
