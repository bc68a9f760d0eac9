// A small CNN for teaching and quick runs: three conv-BN-ReLU stages (the first two followed by
// 2x2 max pooling), global average pooling and a linear classifier. At width 16 it has about
// 24k parameters and trains to high accuracy on the synthetic dataset in seconds.
#pragma once
#include <memory>
#include "engine/nn/layers.h"

namespace duet::models {

class SmallCNN : public nn::Module {
public:
  // Input [N, in_channels, H, W] with H, W >= 4 (two 2x2 poolings).
  SmallCNN(int64_t num_classes, int64_t in_channels = 3, int64_t width = 16);
  Tensor forward(const Tensor& x) override;
  std::string type_name() const override { return "SmallCNN"; }
  std::shared_ptr<nn::Sequential> features;  // conv stages and pooling, ending in [N, 4*width]
  std::shared_ptr<nn::Linear> classifier;
  int64_t in_channels;
};

std::shared_ptr<nn::Module> small_cnn(int64_t num_classes, int64_t in_channels = 3, int64_t width = 16);

}  // namespace duet::models
