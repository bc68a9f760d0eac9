// The optimizer base: groups, the step loop, and state for checkpoints.
#include "engine/optim/optimizer.h"
#include <charconv>
#include <cmath>
#include <set>
#include "engine/autograd.h"
#include "engine/ops/frontend.h"
#include "engine/profiler/events.h"

namespace duet::optim {

namespace {
// t (a gradient or state) with the parameter's strides, allocated under t's memory tag.
Tensor in_layout_of(const Tensor& t, const Tensor& param) {
  MemTagGuard tag(t.storage()->tag);
  return detail::same_layout(t, param);
}
}  // namespace

Optimizer::Optimizer(std::vector<ParamGroup> groups) {
  for (ParamGroup& g : groups) add_param_group(std::move(g));
}

void Optimizer::check_group(const ParamGroup& g, size_t index) {
  DUET_CHECK(std::isfinite(g.lr) && g.lr >= 0, "optimizer: group {} has lr {}, expected a finite value >= 0", index,
             g.lr);
  DUET_CHECK(g.weight_decay >= 0, "optimizer: group {} has weight_decay {}, expected >= 0", index, g.weight_decay);
}

void Optimizer::add_param_group(ParamGroup g) {
  const size_t gi = groups_.size();
  check_group(g, gi);
  std::set<const TensorImpl*> seen;
  for (const ParamGroup& other : groups_)
    for (const Tensor& p : other.params) seen.insert(p.impl());
  for (size_t j = 0; j < g.params.size(); ++j) {
    const Tensor& p = g.params[j];
    DUET_CHECK(p.defined(), "optimizer: parameter {} of group {} is an undefined tensor", j, gi);
    DUET_CHECK(p.is_leaf(), "optimizer: parameter {} of group {} (shape {}) is the output of '{}', expected a leaf", j,
               gi, shape_str(p.shape()), p.grad_fn()->name);
    DUET_CHECK(is_floating(p.dtype()), "optimizer: parameter {} of group {} has dtype {}, expected a floating dtype",
               j, gi, dtype_name(p.dtype()));
    DUET_CHECK(seen.insert(p.impl()).second,
               "optimizer: parameter {} of group {} (shape {}) appears more than once across the groups", j, gi,
               shape_str(p.shape()));
  }
  state_.emplace_back(g.params.size());
  groups_.push_back(std::move(g));
}

void Optimizer::step() {
  NoGradGuard no_grad;
  profiler::PhaseGuard phase(Phase::optimizer);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& g = groups_[gi];
    for (size_t j = 0; j < g.params.size(); ++j) {
      const Tensor& p = g.params[j];
      Tensor grad = p.grad();
      if (!grad.defined()) continue;
      DUET_CHECK(grad.dtype() == p.dtype() && grad.device() == p.device(),
                 "{}: parameter {} of group {} is {} on {} but its gradient is {} on {}", name(), j, gi,
                 dtype_name(p.dtype()), p.device().str(), dtype_name(grad.dtype()), grad.device().str());
      // The update runs over memory, element i of each tensor at the same offset: gradient and
      // state are brought to the parameter's layout (state only once, after Module::to(format)).
      grad = in_layout_of(grad, p);
      ParamState& s = state_[gi][j];
      for (auto& [n, t] : s.tensors) t = in_layout_of(t, p);
      update(g, p, grad, s);
    }
  }
  ++steps_;
}

void Optimizer::zero_grad() {
  for (const ParamGroup& g : groups_)
    for (const Tensor& p : g.params) p.zero_grad();
}

double Optimizer::lr() const {
  DUET_CHECK(!groups_.empty(), "{}: lr() on an optimizer without parameter groups", name());
  return groups_[0].lr;
}

void Optimizer::set_lr(double lr) {
  DUET_CHECK(std::isfinite(lr) && lr >= 0, "{}: set_lr({}): expected a finite value >= 0", name(), lr);
  for (ParamGroup& g : groups_) g.lr = lr;
}

Tensor Optimizer::new_state(const Tensor& param) {
  MemTagGuard tag(MemTag::optimizer_state);
  return Tensor::zeros_like(param);
}

Optimizer::ParamState& Optimizer::state_at(int64_t flat_index, const Tensor** param) {
  int64_t i = flat_index;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    const int64_t n = static_cast<int64_t>(groups_[gi].params.size());
    if (i < n) {
      if (param) *param = &groups_[gi].params[static_cast<size_t>(i)];
      return state_[gi][static_cast<size_t>(i)];
    }
    i -= n;
  }
  throw Error(fmt::format("{}: state for parameter {} given, but the optimizer has only {} parameters", name(),
                          flat_index, flat_index - i));
}

std::vector<std::string> Optimizer::stepped_state_names() const {
  std::vector<std::string> out{"steps"};
  int64_t index = 0;
  for (const ParamGroup& g : groups_) {
    const std::vector<std::string> names = state_names(g);
    for (const Tensor& p : g.params) {
      if (p.requires_grad()) {
        for (const std::string& n : names) out.push_back(fmt::format("state.{}.{}", index, n));
        out.push_back(fmt::format("state.{}.step", index));
      }
      ++index;
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state_tensors() const {
  std::vector<std::pair<std::string, Tensor>> out;
  int64_t index = 0;
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const ParamState& s : state_[gi]) {
      for (const auto& [n, t] : s.tensors) out.emplace_back(fmt::format("state.{}.{}", index, n), t);
      if (s.step > 0 || !s.empty())
        out.emplace_back(fmt::format("state.{}.step", index), Tensor::scalar(static_cast<double>(s.step), DType::i64));
      ++index;
    }
  }
  out.emplace_back("steps", Tensor::scalar(static_cast<double>(steps_), DType::i64));
  return out;
}

void Optimizer::load_state_tensors(const std::vector<std::pair<std::string, Tensor>>& state) {
  NoGradGuard no_grad;
  for (const auto& [key, value] : state) {
    DUET_CHECK(value.defined(), "{}: state '{}' is an undefined tensor", name(), key);
    // (explicit parameters: clang 14 cannot capture structured bindings)
    const auto count = [this](const std::string& entry, const Tensor& t) {
      DUET_CHECK(t.numel() == 1 && !is_floating(t.dtype()), "{}: state entry '{}' is {} {}; expected an integer scalar",
                 name(), entry, dtype_name(t.dtype()), shape_str(t.shape()));
      const double v = t.item();
      DUET_CHECK(v >= 0 && v < 9.0e18, "{}: state entry '{}' is {}; expected a step count >= 0", name(), entry, v);
      return static_cast<int64_t>(v);
    };
    if (key == "steps") {
      steps_ = count(key, value);
      continue;
    }
    // "state.<index>.<buffer>"
    const size_t dot1 = key.find('.'), dot2 = dot1 == std::string::npos ? dot1 : key.find('.', dot1 + 1);
    DUET_CHECK(key.rfind("state.", 0) == 0 && dot2 != std::string::npos && dot2 > dot1 + 1,
               "{}: unknown state entry '{}': expected 'steps' or 'state.<index>.<name>'", name(), key);
    const std::string idx = key.substr(dot1 + 1, dot2 - dot1 - 1), buf = key.substr(dot2 + 1);
    DUET_CHECK(idx.find_first_not_of("0123456789") == std::string::npos,
               "{}: state entry '{}' has parameter index '{}', expected a number", name(), key, idx);
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(idx.data(), idx.data() + idx.size(), index);
    DUET_CHECK(ec == std::errc() && end == idx.data() + idx.size(),
               "{}: state entry '{}' has parameter index {}, too large for this optimizer's parameters", name(), key,
               idx);
    const Tensor* param = nullptr;
    ParamState& s = state_at(index, &param);
    if (buf == "step") {
      s.step = count(key, value);
      continue;
    }
    const ParamGroup* group = nullptr;
    for (const ParamGroup& g : groups_)
      for (const Tensor& p : g.params)
        if (p.same(*param)) group = &g;
    const std::vector<std::string> names = state_names(*group);
    bool known = false;
    for (const std::string& n : names) known = known || n == buf;
    DUET_CHECK(known, "{}: state entry '{}' names buffer '{}', which this optimizer does not keep", name(), key, buf);
    DUET_CHECK(value.shape() == param->shape(), "{}: state entry '{}' has shape {}, expected the parameter's shape {}",
               name(), key, shape_str(value.shape()), shape_str(param->shape()));
    if (s.empty())
      for (const std::string& n : names) s.tensors.emplace_back(n, new_state(*param));
    for (auto& [n, t] : s.tensors)
      if (n == buf) t.copy_(value.to(t.device()));
  }
}

int64_t Optimizer::state_bytes() const {
  int64_t b = 0;
  for (const auto& group : state_)
    for (const ParamState& s : group)
      for (const auto& [n, t] : s.tensors) b += static_cast<int64_t>(t.nbytes());
  return b;
}

}  // namespace duet::optim
