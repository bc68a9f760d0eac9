#include "engine/autograd.h"
#include <unordered_map>
#include "engine/functional.h"
#include "engine/profiler/events.h"

namespace duet {

namespace {
thread_local bool t_grad_mode = true;
thread_local LeafGradReadyFn t_leaf_hook;

Edge edge_of(const Tensor& t) {
  Edge e;
  if (!t.defined()) return e;
  if (t.grad_fn()) {
    e.fn = t.grad_fn();
    e.output_nr = t.impl()->output_nr;
  } else if (t.requires_grad()) {
    e.leaf = t.impl_ptr();
  }
  return e;
}

void record_impl(const char* name, std::vector<Edge> edges, const std::vector<Tensor*>& outputs, BackwardFn fn) {
  auto node = std::make_shared<Node>();
  node->name = name;
  if (profiler::enabled()) node->scope = profiler::current_scope();  // only reports need it
  node->next = std::move(edges);
  node->backward = std::move(fn);
  int nr = 0;
  for (Tensor* out : outputs) {
    if (out && out->defined()) {
      node->outputs.push_back({out->shape(), out->dtype(), out->device()});
      TensorImpl* impl = out->impl();
      impl->requires_grad = true;
      impl->grad_fn = node;
      impl->output_nr = nr;
    } else {
      node->outputs.push_back({});
    }
    ++nr;
  }
}

// The sum of two gradients reaching one tensor. A buffer nobody else holds is added into in place
// (no allocation, and the sum stays in cache: DenseNet adds up to 24 slices into each feature
// map's gradient); a shared one (a slice of cat's gradient, or one tensor handed to two inputs)
// gets a new buffer.
Tensor accumulate(Tensor acc, const Tensor& g) {
  const bool exclusive = acc.impl_ptr().use_count() == 1 && acc.storage().use_count() == 1 && acc.is_dense() &&
                         acc.dtype() == g.dtype() && acc.shape() == g.shape() && acc.device() == g.device() &&
                         !acc.requires_grad();
  if (!exclusive) return add(acc, g);
  add_(acc, g);
  return acc;
}

// Gradients handed to a leaf become its .grad. A buffer nobody else holds is kept as is (and
// counted as gradient memory); anything shared is copied, so later in-place updates of .grad
// can never write into another tensor.
void accumulate_into_leaf(TensorImpl* leaf, const Tensor& g) {
  DUET_CHECK(g.shape() == leaf->shape, "autograd: gradient of shape {} for a leaf of shape {}", shape_str(g.shape()),
             shape_str(leaf->shape));
  if (!leaf->grad.defined()) {
    const bool exclusive = g.impl_ptr().use_count() == 1 && g.storage().use_count() == 1 && g.strides() == leaf->strides &&
                           g.offset() == 0 && static_cast<size_t>(g.numel()) * dtype_size(g.dtype()) == g.storage()->bytes;
    if (exclusive) {
      Storage& s = *g.storage();
      if (s.tag != MemTag::gradient) {
        s.allocator->retag(s.bytes, s.tag, MemTag::gradient);
        s.tag = MemTag::gradient;
      }
      leaf->grad = g;
    } else {
      // The copy takes the leaf's layout when the leaf is channels-last (PyTorch's
      // AccumulateGrad does the same): a channel slice of a channels-last gradient (cat's
      // backward) then copies rows instead of transposing into NCHW.
      MemTagGuard tag(MemTag::gradient);
      const bool cl = leaf->shape.size() == 4 && leaf->strides != contiguous_strides(leaf->shape) &&
                      leaf->strides == channels_last_strides(leaf->shape);
      leaf->grad = cl && !g.is_contiguous(MemoryFormat::channels_last) ? g.contiguous(MemoryFormat::channels_last) : g.clone();
    }
  } else {
    MemTagGuard tag(MemTag::gradient);
    leaf->grad = add(leaf->grad, g);
  }
}
}  // namespace

bool grad_mode_enabled() { return t_grad_mode; }
LeafGradHookGuard::LeafGradHookGuard(LeafGradReadyFn fn) : prev_(std::move(t_leaf_hook)) { t_leaf_hook = std::move(fn); }
LeafGradHookGuard::~LeafGradHookGuard() { t_leaf_hook = std::move(prev_); }
NoGradGuard::NoGradGuard() : prev_(t_grad_mode) { t_grad_mode = false; }
NoGradGuard::~NoGradGuard() { t_grad_mode = prev_; }

bool should_record(std::initializer_list<const Tensor*> inputs) {
  if (!t_grad_mode) return false;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->requires_grad()) return true;
  return false;
}

void record(const char* name, std::initializer_list<const Tensor*> inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor* t : inputs) edges.push_back(t ? edge_of(*t) : Edge{});
  record_impl(name, std::move(edges), std::vector<Tensor*>(outputs), std::move(backward));
}

void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor*> outputs, BackwardFn backward) {
  std::vector<Edge> edges;
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(edge_of(t));
  record_impl(name, std::move(edges), outputs, std::move(backward));
}

void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph) {
  DUET_CHECK(root.defined(), "backward() called on an undefined tensor");
  DUET_CHECK(root.requires_grad(),
             "backward() called on a tensor that does not require grad and has no grad_fn: "
             "expected the result of ops on tensors created with requires_grad=true");
  NoGradGuard no_grad;  // backward computes values, not a graph of its own (no double backward)
  profiler::PhaseGuard phase(Phase::backward);
  Tensor g = grad;
  if (!g.defined()) {
    DUET_CHECK(root.numel() == 1,
               "backward() on a tensor of shape {} needs a gradient argument: only one-element outputs get an "
               "implicit gradient of 1",
               shape_str(root.shape()));
    g = Tensor::ones(root.shape(), TensorOptions(root.dtype()).with_device(root.device()));
  } else {
    DUET_CHECK(g.shape() == root.shape(), "backward(): gradient has shape {}, expected the output's shape {}",
               shape_str(g.shape()), shape_str(root.shape()));
    DUET_CHECK(g.dtype() == root.dtype(), "backward(): gradient has dtype {}, expected {}", dtype_name(g.dtype()),
               dtype_name(root.dtype()));
  }

  // Copied: a hook may install or drop guards of its own.
  const LeafGradReadyFn hook = t_leaf_hook;
  if (!root.grad_fn()) {  // the root is a leaf
    accumulate_into_leaf(root.impl(), g);
    if (hook) hook(root.impl());
    return;
  }

  // Count, for every node reachable from the root, how many edges point at it (and, when a hook
  // listens, at every leaf: its gradient is final when the last of them has delivered).
  std::unordered_map<Node*, int> deps;
  std::unordered_map<TensorImpl*, int> leaf_edges;
  std::vector<TensorImpl*> leaf_order;  // first-seen order, for the end-of-pass reports
  std::vector<Node*> stack{root.grad_fn().get()};
  deps[root.grad_fn().get()] = 0;
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next) {
      if (hook && e.leaf) {
        if (leaf_edges[e.leaf.get()]++ == 0) leaf_order.push_back(e.leaf.get());
      }
      if (!e.fn) continue;
      auto [it, inserted] = deps.try_emplace(e.fn.get(), 0);
      it->second++;
      if (inserted) stack.push_back(e.fn.get());
    }
  }

  // Gradient buffers per node output; a node runs once all its consumers have run.
  std::unordered_map<Node*, std::vector<Tensor>> grads;
  grads[root.grad_fn().get()].resize(root.grad_fn()->outputs.size());
  grads[root.grad_fn().get()][root.impl()->output_nr] = g;
  std::vector<std::shared_ptr<Node>> ready{root.grad_fn()};
  while (!ready.empty()) {
    std::shared_ptr<Node> node = std::move(ready.back());
    ready.pop_back();
    DUET_CHECK(node->backward != nullptr,
               "backward through '{}' a second time: its saved tensors were freed after the first backward; pass "
               "retain_graph=true to the first call to keep them",
               node->name);
    std::vector<Tensor> out_grads = std::move(grads[node.get()]);
    grads.erase(node.get());
    out_grads.resize(node->outputs.size());
    for (size_t i = 0; i < out_grads.size(); ++i) {
      if (!out_grads[i].defined()) {  // an output nobody used: its gradient is zero
        const OutputMeta& m = node->outputs[i];
        out_grads[i] = Tensor::zeros(m.shape, TensorOptions(m.dtype).with_device(m.device));
      }
    }
    std::vector<Tensor> in_grads;
    {
      profiler::ScopeReplace scope(node->scope);
      in_grads = node->backward(out_grads);
    }
    if (!retain_graph) node->backward = nullptr;  // frees the saved tensors now, not at graph death
    // Drop the incoming gradients before passing the outgoing ones on: a view's backward returns
    // a view of its incoming gradient, and a leaf takes a gradient as its .grad without a copy
    // only when nothing else holds the buffer (k's gradient through k.transpose(-1, -2)).
    out_grads.clear();
    DUET_CHECK(in_grads.size() == node->next.size(), "internal: backward of '{}' returned {} gradients for {} inputs",
               node->name, in_grads.size(), node->next.size());
    for (size_t i = 0; i < in_grads.size(); ++i) {
      const Edge& e = node->next[i];
      if (hook && e.leaf) {  // counted whether or not a gradient comes along this edge
        if (in_grads[i].defined()) accumulate_into_leaf(e.leaf.get(), in_grads[i]);
        if (--leaf_edges[e.leaf.get()] == 0) hook(e.leaf.get());
        continue;
      }
      if (!e.valid() || !in_grads[i].defined()) continue;
      if (e.leaf) {
        accumulate_into_leaf(e.leaf.get(), in_grads[i]);
        continue;
      }
      auto& buf = grads[e.fn.get()];
      buf.resize(e.fn->outputs.size());
      Tensor& slot = buf[e.output_nr];
      slot = slot.defined() ? accumulate(std::move(slot), in_grads[i]) : in_grads[i];
      if (--deps[e.fn.get()] == 0) ready.push_back(e.fn);
    }
  }
  // Leaves behind a node that never ran (every gradient into it was undefined) are final now.
  for (TensorImpl* leaf : leaf_order)
    if (leaf_edges[leaf] > 0) hook(leaf);
}

}  // namespace duet
