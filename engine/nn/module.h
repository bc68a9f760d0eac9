// nn::Module: a tree of named parameters, buffers and sub-modules, as in PyTorch. Names are
// dotted paths ("layer1.0.conv1.weight") exactly as torchvision spells them, so weight files
// exported from torchvision map one to one. Calling a module pushes its name onto the profiler's
// scope, so every op it runs is attributed to its layer ("layer1.0.conv1").
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>
#include "engine/tensor.h"

namespace duet::nn {

class Module {
public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. Every duet model maps one tensor to one tensor.
  virtual Tensor forward(const Tensor& x) = 0;
  // forward() inside a profiler scope named after this module's attribute name.
  Tensor operator()(const Tensor& x);

  // Recursive, in registration order, with dotted names.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<std::pair<std::string, Tensor>> named_buffers() const;
  std::vector<Tensor> parameters() const;  // all parameters, frozen ones included
  std::vector<std::pair<std::string, Module*>> named_modules() const;  // this one first, as ""
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }
  int64_t num_parameters() const;

  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Moves parameters and buffers in place (handles held elsewhere see the move).
  void to(Device d);
  void to(DType t);
  // 4-D parameters and buffers (convolution weights) to layout f, as PyTorch's
  // model.to(memory_format=...). A channels-last model's convolutions read their weights and write
  // the weight gradients in the layout of channels-last activations, and the optimizer keeps its
  // state in the parameters' layout, so no step copies a weight to change its layout.
  void to(MemoryFormat f);
  // Gradients of all parameters dropped (PyTorch's zero_grad(set_to_none=True)).
  void zero_grad();
  // requires_grad on every parameter (freezing a backbone for transfer learning).
  void requires_grad_(bool on);
  // Inference only: every parameter and buffer read-only (Tensor::freeze) until unfreeze(), so
  // that backends may keep them in their own layouts, and autocast their 16-bit copies, from one
  // forward to the next instead of converting them at every call (what ONNX Runtime's and
  // PyTorch's frozen graphs do with weights). A training step, load_state_dict or any in-place
  // write to them is then a duet::Error. duet eval, predict and profile --inference freeze the
  // model; evaluation during training freezes it for the pass (FrozenForInference).
  void freeze();
  void unfreeze();

  // A short type name for printing ("Conv2d", "BasicBlock").
  virtual std::string type_name() const { return "Module"; }
  // Constructor arguments for printing ("3, 64, kernel_size=(3, 3)").
  virtual std::string extra_repr() const { return ""; }
  std::string str(int indent = 0) const;  // PyTorch-style module tree
  const std::string& name() const { return name_; }

protected:
  // Registers a parameter (a leaf that requires grad, counted as parameter memory).
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> m) {
    m->name_ = name;
    children_.emplace_back(name, m);
    return m;
  }

private:
  void collect(const std::string& prefix, bool buffers, std::vector<std::pair<std::string, Tensor>>& out) const;
  std::vector<std::pair<std::string, Tensor>> params_, buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
  std::string name_;
};

using ModulePtr = std::shared_ptr<Module>;

// The parameters and buffers of a module that were not frozen, frozen for the life of the scope (an
// evaluation pass between training epochs).
class FrozenForInference {
public:
  explicit FrozenForInference(Module& m);
  ~FrozenForInference();
  FrozenForInference(const FrozenForInference&) = delete;
  FrozenForInference& operator=(const FrozenForInference&) = delete;

private:
  std::vector<Tensor> frozen_;
};

}  // namespace duet::nn
