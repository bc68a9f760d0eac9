// A multi-layer perceptron on flattened inputs: depth hidden Linear-ReLU layers, then a linear
// classifier. Any input shape [N, ...] whose trailing dims multiply to in_features works.
#pragma once
#include <memory>
#include "engine/nn/layers.h"

namespace duet::models {

class MLP : public nn::Module {
public:
  MLP(int64_t in_features, int64_t num_classes, int64_t hidden = 128, int64_t depth = 2);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "MLP"; }
  std::shared_ptr<nn::Sequential> layers;  // Linear, ReLU, ..., Linear
  int64_t in_features;
};

std::shared_ptr<nn::Module> mlp(int64_t in_features, int64_t num_classes, int64_t hidden = 128, int64_t depth = 2);

}  // namespace duet::models
