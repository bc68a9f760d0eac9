#include "models/mlp.h"

namespace duet::models {

MLP::MLP(int64_t in, int64_t num_classes, int64_t hidden, int64_t depth) : in_features(in) {
  DUET_CHECK(in >= 1 && num_classes >= 1 && hidden >= 1 && depth >= 0,
             "mlp: in_features={}, num_classes={}, hidden={}, depth={}: expected sizes >= 1 and depth >= 0", in,
             num_classes, hidden, depth);
  layers = register_module("layers", std::make_shared<nn::Sequential>());
  int64_t width = in;
  for (int64_t i = 0; i < depth; ++i) {
    layers->push_back(std::make_shared<nn::Linear>(width, hidden));
    layers->push_back(nn::ReLU());
    width = hidden;
  }
  layers->push_back(std::make_shared<nn::Linear>(width, num_classes));
}

Tensor MLP::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() >= 2 && x.numel() / std::max<int64_t>(x.size(0), 1) == in_features,
             "mlp: input has shape {}, expected [N, ...] with {} features per sample",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), in_features);
  return (*layers)(x.flatten(1));
}

std::shared_ptr<nn::Module> mlp(int64_t in_features, int64_t num_classes, int64_t hidden, int64_t depth) {
  return std::make_shared<MLP>(in_features, num_classes, hidden, depth);
}

}  // namespace duet::models
