// DenseNet, its dense layers, blocks and named configurations (torchvision/models/densenet.py).
#include "models/densenet.h"
#include <cmath>
#include "engine/autograd.h"
#include "engine/nn/conv_bn.h"
#include "models/blocks.h"

namespace duet::models {

DenseLayer::DenseLayer(int64_t in, int64_t growth_rate, int64_t bn_size, double drop)
    : drop_rate(drop) {
  norm1 = register_module("norm1", std::make_shared<nn::BatchNorm2d>(in));
  relu1 = register_module("relu1", nn::ReLU());
  conv1 = register_module("conv1", std::make_shared<nn::Conv2d>(in, bn_size * growth_rate, 1,
                                                                nn::Conv2dOptions{.bias = false}));
  norm2 = register_module("norm2", std::make_shared<nn::BatchNorm2d>(bn_size * growth_rate));
  relu2 = register_module("relu2", nn::ReLU());
  conv2 = register_module("conv2", std::make_shared<nn::Conv2d>(bn_size * growth_rate, growth_rate, 3,
                                                                nn::Conv2dOptions{.padding = 1, .bias = false}));
}

Tensor DenseLayer::forward(const Tensor& x) {
  // norm then relu, fused (relu1/relu2 stay registered, as in torchvision); conv1, norm2 and relu2
  // as one nn::conv_bn call (norm1 reads the concatenated features, which no convolution wrote).
  const Tensor bottleneck = nn::conv_bn(*conv1, *norm2, norm1->forward_act(x, Activation::relu), Activation::relu);
  Tensor y = (*conv2)(bottleneck);
  if (drop_rate > 0) y = dropout(y, drop_rate, is_training());
  return y;
}

DenseBlock::DenseBlock(int64_t num_layers, int64_t in, int64_t bn_size, int64_t growth_rate, double drop) {
  for (int64_t i = 0; i < num_layers; ++i)
    layers.push_back(register_module(fmt::format("denselayer{}", i + 1),
                                     std::make_shared<DenseLayer>(in + i * growth_rate, growth_rate, bn_size, drop)));
}

// Memory: layer i reads cat(x, y_1, ..., y_{i-1}), a fresh copy of everything so far. In training
// that copy stays alive until backward (norm1's batch_norm saves it), and so do norm1's output
// (relu1 saves it) and relu1's output (conv1 saves it for its weight gradient): three tensors of
// the running width per layer, so a block's activation memory grows with the square of its depth.
// torchvision's memory_efficient=True recomputes these in backward; duet keeps them.
//
// The running concatenation is built one layer at a time, cat(previous, y_i), rather than from
// all pieces at every layer: the same bytes are copied, in two pieces instead of i + 1 (the
// pieces' count is what a batch-1 pass pays for).
//
// A pass that records no graph (inference) copies nothing twice: the block's output, every
// feature map it will hold, is allocated channels-last up front; x and then each layer's new
// channels are copied into their place once, and layer i reads the channels written so far as a
// slice of it (a view whose pixels lie the full width apart; batch norm reads such slices in place:
// reads_channel_slices_in_batch_norm). The running concatenation's copies grow with the square of
// the depth; these grow with it linearly. Same values as the concatenation, bit for bit.
Tensor DenseBlock::forward(const Tensor& x) {
  Tensor features = x;
  size_t i = 0;
  if (!grad_mode_enabled() && x.dim() == 4 && x.is_contiguous(MemoryFormat::channels_last)) {
    int64_t width = x.size(1);
    for (const auto& layer : layers) width += layer->conv2->weight.size(0);
    const Tensor all = Tensor::empty({x.size(0), width, x.size(2), x.size(3)},
                                     TensorOptions(x.dtype()).with_device(x.device()), MemoryFormat::channels_last);
    int64_t c = x.size(1);  // channels written so far
    all.slice(1, 0, c).copy_(x);
    for (; i < layers.size(); ++i) {
      const Tensor y = (*layers[i])(all.slice(1, 0, c));
      if (y.dtype() != all.dtype()) {
        // A layer whose output is not the block's dtype (an autocast policy deciding otherwise)
        // continues as a concatenation, which promotes as cat does.
        features = cat({all.slice(1, 0, c), y}, 1);
        ++i;
        break;
      }
      all.slice(1, c, c + y.size(1)).copy_(y);
      c += y.size(1);
    }
    if (c == width) return all;
  }
  for (; i < layers.size(); ++i) features = cat({features, (*layers[i])(features)}, 1);
  return features;
}

DenseNet::DenseNet(const DenseNetConfig& cfg) : config(cfg) {
  DUET_CHECK(!cfg.block_config.empty(), "DenseNet: block_config is empty, expected at least one dense block");
  for (int64_t n : cfg.block_config)
    DUET_CHECK(n >= 1, "DenseNet: block_config {} given, expected every layer count >= 1", shape_str(cfg.block_config));
  DUET_CHECK(cfg.growth_rate >= 1 && cfg.num_init_features >= 1 && cfg.bn_size >= 1 && cfg.num_classes >= 1 &&
                 cfg.in_channels >= 1,
             "DenseNet: growth_rate={}, num_init_features={}, bn_size={}, num_classes={}, in_channels={}: expected "
             "all >= 1",
             cfg.growth_rate, cfg.num_init_features, cfg.bn_size, cfg.num_classes, cfg.in_channels);
  DUET_CHECK(cfg.drop_rate >= 0 && cfg.drop_rate < 1, "DenseNet: drop_rate {} given, expected [0, 1)", cfg.drop_rate);

  features = register_module("features", std::make_shared<nn::Sequential>());
  features->push_back("conv0", std::make_shared<nn::Conv2d>(cfg.in_channels, cfg.num_init_features, 7,
                                                           nn::Conv2dOptions{.stride = 2, .padding = 3, .bias = false}));
  features->push_back("norm0", std::make_shared<nn::BatchNorm2d>(cfg.num_init_features));
  features->push_back("relu0", nn::ReLU());
  features->push_back("pool0", std::make_shared<nn::MaxPool2d>(3, 2, 1));
  int64_t num_features = cfg.num_init_features;
  for (size_t i = 0; i < cfg.block_config.size(); ++i) {
    const int64_t n = cfg.block_config[i];
    features->push_back(fmt::format("denseblock{}", i + 1),
                        std::make_shared<DenseBlock>(n, num_features, cfg.bn_size, cfg.growth_rate, cfg.drop_rate));
    num_features += n * cfg.growth_rate;
    if (i + 1 != cfg.block_config.size()) {
      // Transition: compression 0.5 and 2x2 average pooling (torchvision's _Transition).
      auto t = std::make_shared<nn::Sequential>();
      t->push_back("norm", std::make_shared<nn::BatchNorm2d>(num_features));
      t->push_back("relu", nn::ReLU());
      t->push_back("conv", std::make_shared<nn::Conv2d>(num_features, num_features / 2, 1, nn::Conv2dOptions{.bias = false}));
      t->push_back("pool", std::make_shared<nn::AvgPool2d>(2, 2));
      features->push_back(fmt::format("transition{}", i + 1), t);
      num_features /= 2;
    }
  }
  // torchvision calls it norm5 whatever the number of blocks.
  features->push_back("norm5", std::make_shared<nn::BatchNorm2d>(num_features));
  classifier = register_module("classifier", std::make_shared<nn::Linear>(num_features, cfg.num_classes));

  // torchvision: convs kaiming-normal (fan_in, relu gain); BN 1 and 0; classifier bias 0.
  if (cfg.init) init_convs_kaiming_normal(*this, /*fan_out=*/false);
  classifier->bias.zero_();
}

Tensor DenseNet::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == config.in_channels,
             "DenseNet: input has shape {}, expected [N, {}, H, W]",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), config.in_channels);
  const Tensor f = relu((*features)(x));
  return (*classifier)(adaptive_avg_pool2d(f, 1, 1).flatten(1));
}

DenseNetConfig densenet_config(const std::string& name, int64_t num_classes, double width_mult) {
  DUET_CHECK(width_mult > 0, "densenet '{}': width_mult {} given, expected > 0", name, width_mult);
  DenseNetConfig c;
  if (name == "densenet121") c.block_config = {6, 12, 24, 16};
  else if (name == "densenet161") c.growth_rate = 48, c.block_config = {6, 12, 36, 24}, c.num_init_features = 96;
  else if (name == "densenet169") c.block_config = {6, 12, 32, 32};
  else if (name == "densenet201") c.block_config = {6, 12, 48, 32};
  else if (name == "densenet264") c.block_config = {6, 12, 64, 48};
  else
    throw Error(fmt::format("densenet: unknown configuration '{}': expected densenet121, densenet161, densenet169, "
                            "densenet201 or densenet264",
                            name));
  c.growth_rate = std::max<int64_t>(1, std::llround(static_cast<double>(c.growth_rate) * width_mult));
  c.num_init_features = std::max<int64_t>(1, std::llround(static_cast<double>(c.num_init_features) * width_mult));
  c.num_classes = num_classes;
  return c;
}

std::shared_ptr<DenseNet> densenet(const std::string& name, int64_t num_classes, double width_mult) {
  return std::make_shared<DenseNet>(densenet_config(name, num_classes, width_mult));
}

}  // namespace duet::models
