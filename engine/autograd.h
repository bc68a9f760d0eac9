// Define-by-run autograd, as in PyTorch and micrograd: every differentiable op whose inputs
// require grad records a Node holding its backward closure and one edge per input. backward()
// walks the nodes reachable from the root in reverse topological order, accumulating gradients.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>
#include "engine/tensor.h"

namespace duet {

// Where an input's gradient goes: the node that produced it (and which of its outputs), or, for
// a leaf that requires grad, the leaf itself. Neither: the input needs no gradient.
struct Edge {
  std::shared_ptr<Node> fn;
  int output_nr = 0;
  std::shared_ptr<TensorImpl> leaf;
  bool valid() const { return fn != nullptr || leaf != nullptr; }
};

// grads[i] is the gradient of the node's output i (zeros when that output got none). Returns one
// gradient per input; an undefined Tensor where the input needs none (see needs_grad).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;

struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
};

struct Node {
  const char* name = "";   // the forward op, e.g. "conv2d"
  std::string scope;       // module path at forward time, so backward ops land on the same layer
  std::vector<Edge> next;  // one per input
  std::vector<OutputMeta> outputs;
  BackwardFn backward;     // released after use unless the graph is retained
  bool needs_grad(size_t input) const { return input < next.size() && next[input].valid(); }
};

// Grad mode: on by default; NoGradGuard turns recording off (evaluation, optimizer steps).
bool grad_mode_enabled();
class NoGradGuard {
public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;
private:
  bool prev_;
};

// True when grad mode is on and some input requires grad: only then do ops record nodes.
bool should_record(std::initializer_list<const Tensor*> inputs);

// Records a node for outputs computed from inputs (undefined inputs/outputs are allowed and
// ignored). Call only when should_record(inputs).
void record(const char* name, std::initializer_list<const Tensor*> inputs, std::initializer_list<Tensor*> outputs,
            BackwardFn backward);
void record(const char* name, const std::vector<Tensor>& inputs, std::vector<Tensor*> outputs, BackwardFn backward);

// Runs backward from root with the given gradient (ones for a one-element root if undefined).
void run_backward(const Tensor& root, const Tensor& grad, bool retain_graph);

// Post-accumulate-grad hook (PyTorch's register_post_accumulate_grad_hook, for every leaf at
// once): while a guard lives, backward passes on this thread call `fn(leaf)` once for every leaf
// they reach, as soon as no more gradient can flow into it in this pass, so its .grad is final
// while the rest of backward still runs. A leaf whose remaining paths carry no gradient is
// reported at the end of the pass at the latest. Data-parallel training starts averaging a bucket
// of gradients here, overlapping communication with the rest of backward; the engine itself knows
// nothing about who listens. Guards nest: the innermost one's hook is called.
using LeafGradReadyFn = std::function<void(TensorImpl* leaf)>;
class LeafGradHookGuard {
public:
  explicit LeafGradHookGuard(LeafGradReadyFn fn);
  ~LeafGradHookGuard();
  LeafGradHookGuard(const LeafGradHookGuard&) = delete;
  LeafGradHookGuard& operator=(const LeafGradHookGuard&) = delete;

private:
  LeafGradReadyFn prev_;
};

}  // namespace duet
