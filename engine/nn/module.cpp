// nn::Module: the parameter tree, mode switches, in-place moves and printing.
#include "engine/nn/module.h"
#include <functional>
#include "engine/autograd.h"
#include "engine/profiler/events.h"

namespace duet::nn {

namespace {
// Registered tensors count as model state in the memory breakdown, whoever allocated them.
void tag_as_parameter(const Tensor& t) {
  Storage& s = *t.storage();
  if (s.tag == MemTag::parameter) return;
  s.allocator->retag(s.bytes, s.tag, MemTag::parameter);
  s.tag = MemTag::parameter;
}

// Replaces the data behind t's handle with `moved`, so every copy of the handle (an optimizer's
// parameter list, a layer's `weight` field) sees the new device or dtype.
void swap_data(const Tensor& t, const Tensor& moved) {
  TensorImpl* impl = t.impl();
  impl->storage = moved.storage();
  impl->shape = moved.shape();
  impl->strides = moved.strides();
  impl->offset = moved.offset();
  impl->dtype = moved.dtype();
}

// The converted copy is allocated with the original's tag so parameters stay parameters.
void move_tensor(const Tensor& t, const std::function<Tensor(const Tensor&)>& convert) {
  NoGradGuard no_grad;
  MemTagGuard tag(t.storage()->tag);
  const Tensor moved = convert(t.detach());
  const Tensor grad = t.grad();
  Tensor moved_grad;
  if (grad.defined()) {
    MemTagGuard gtag(MemTag::gradient);
    moved_grad = convert(grad.detach());
  }
  swap_data(t, moved);
  if (grad.defined()) t.set_grad(moved_grad);
}

void check_name(const std::string& what, const std::string& name) {
  DUET_CHECK(!name.empty() && name.find('.') == std::string::npos,
             "register_{}: name '{}' is invalid: expected a non-empty name without '.'", what, name);
}
}  // namespace

Tensor Module::operator()(const Tensor& x) {
  // The scope string is copied into every autograd node; leaving it empty when nobody profiles
  // keeps that copy free.
  if (!profiler::enabled()) return forward(x);
  profiler::ScopeGuard scope(name_);
  return forward(x);
}

void Module::collect(const std::string& prefix, bool buffers, std::vector<std::pair<std::string, Tensor>>& out) const {
  for (const auto& [n, t] : buffers ? buffers_ : params_) out.emplace_back(prefix + n, t);
  for (const auto& [n, m] : children_) m->collect(prefix + n + ".", buffers, out);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", false, out);
  return out;
}

std::vector<std::pair<std::string, Tensor>> Module::named_buffers() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, Module*>> out;
  std::function<void(const std::string&, const Module*)> walk = [&](const std::string& path, const Module* m) {
    out.emplace_back(path, const_cast<Module*>(m));
    for (const auto& [n, c] : m->children_) walk(path.empty() ? n : path + "." + n, c.get());
  };
  walk("", this);
  return out;
}

int64_t Module::num_parameters() const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) n += t.numel();
  return n;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

void Module::to(Device d) {
  const auto convert = [d](const Tensor& t) { return t.to(d); };
  for (auto& [n, t] : named_parameters())
    if (t.device() != d) move_tensor(t, convert);
  for (auto& [n, t] : named_buffers())
    if (t.device() != d) move_tensor(t, convert);
}

void Module::to(DType dt) {
  DUET_CHECK(is_floating(dt), "Module::to({}): expected a floating-point dtype (f32, f64, f16, bf16)", dtype_name(dt));
  // As in PyTorch, only floating-point tensors change dtype (num_batches_tracked stays i64).
  const auto convert = [dt](const Tensor& t) { return t.to(dt); };  // keeps a contiguous or channels-last layout
  for (auto& [n, t] : named_parameters())
    if (is_floating(t.dtype()) && t.dtype() != dt) move_tensor(t, convert);
  for (auto& [n, t] : named_buffers())
    if (is_floating(t.dtype()) && t.dtype() != dt) move_tensor(t, convert);
}

void Module::to(MemoryFormat f) {
  const auto convert = [f](const Tensor& t) { return t.contiguous(f); };
  for (auto& [n, t] : named_parameters())
    if (t.dim() == 4 && !t.is_contiguous(f)) move_tensor(t, convert);
  for (auto& [n, t] : named_buffers())
    if (t.dim() == 4 && !t.is_contiguous(f)) move_tensor(t, convert);
}

void Module::zero_grad() {
  for (auto& [n, t] : named_parameters()) t.zero_grad();
}

void Module::freeze() {
  for (auto& [n, t] : named_parameters()) t.freeze();
  for (auto& [n, t] : named_buffers()) t.freeze();
}

void Module::unfreeze() {
  for (auto& [n, t] : named_parameters()) t.unfreeze();
  for (auto& [n, t] : named_buffers()) t.unfreeze();
}

FrozenForInference::FrozenForInference(Module& m) {
  for (const auto& list : {m.named_parameters(), m.named_buffers()})
    for (const auto& [n, t] : list)
      if (!t.is_frozen()) {
        t.freeze();
        frozen_.push_back(t);
      }
}

FrozenForInference::~FrozenForInference() {
  for (const Tensor& t : frozen_) t.unfreeze();
}

void Module::requires_grad_(bool on) {
  for (auto& [n, t] : named_parameters()) {
    Tensor h = t;
    h.set_requires_grad(on);
  }
}

std::string Module::str(int indent) const {
  std::string s = type_name() + "(";
  if (children_.empty()) return s + extra_repr() + ")";
  const std::string extra = extra_repr();
  const std::string pad(static_cast<size_t>(indent) + 2, ' ');
  if (!extra.empty()) s += "\n" + pad + extra;
  for (const auto& [n, m] : children_) s += "\n" + pad + "(" + n + "): " + m->str(indent + 2);
  return s + "\n" + std::string(static_cast<size_t>(indent), ' ') + ")";
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_name("parameter", name);
  DUET_CHECK(t.defined(), "register_parameter('{}'): the tensor is undefined", name);
  DUET_CHECK(t.is_leaf(), "register_parameter('{}'): the tensor is the output of '{}', expected a leaf (detach() it)",
             name, t.grad_fn()->name);
  DUET_CHECK(is_floating(t.dtype()), "register_parameter('{}'): dtype {} given, expected a floating-point dtype", name,
             dtype_name(t.dtype()));
  for (const auto& [n, p] : params_)
    DUET_CHECK(n != name, "register_parameter('{}'): a parameter of that name is already registered", name);
  tag_as_parameter(t);
  t.set_requires_grad(requires_grad);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_name("buffer", name);
  DUET_CHECK(t.defined(), "register_buffer('{}'): the tensor is undefined", name);
  for (const auto& [n, b] : buffers_)
    DUET_CHECK(n != name, "register_buffer('{}'): a buffer of that name is already registered", name);
  tag_as_parameter(t);
  buffers_.emplace_back(name, t);
  return t;
}

}  // namespace duet::nn
