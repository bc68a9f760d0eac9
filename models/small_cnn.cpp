#include "models/small_cnn.h"

namespace duet::models {

namespace {
// Conv without bias: the batch norm right after it has its own shift.
void conv_bn_relu(nn::Sequential& s, int64_t in, int64_t out) {
  s.push_back(std::make_shared<nn::Conv2d>(in, out, 3, nn::Conv2dOptions{.padding = 1, .bias = false}));
  s.push_back(std::make_shared<nn::BatchNorm2d>(out));
  s.push_back(nn::ReLU());
}
}  // namespace

SmallCNN::SmallCNN(int64_t num_classes, int64_t in_ch, int64_t width) : in_channels(in_ch) {
  DUET_CHECK(num_classes >= 1 && in_ch >= 1 && width >= 1,
             "small_cnn: num_classes={}, in_channels={}, width={}: expected all >= 1", num_classes, in_ch, width);
  features = register_module("features", std::make_shared<nn::Sequential>());
  conv_bn_relu(*features, in_ch, width);
  features->push_back(std::make_shared<nn::MaxPool2d>(2, 2));
  conv_bn_relu(*features, width, 2 * width);
  features->push_back(std::make_shared<nn::MaxPool2d>(2, 2));
  conv_bn_relu(*features, 2 * width, 4 * width);
  features->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1, 1));
  features->push_back(std::make_shared<nn::Flatten>(1));
  classifier = register_module("classifier", std::make_shared<nn::Linear>(4 * width, num_classes));
}

Tensor SmallCNN::forward(const Tensor& x) {
  DUET_CHECK(x.defined() && x.dim() == 4 && x.size(1) == in_channels && x.size(2) >= 4 && x.size(3) >= 4,
             "small_cnn: input has shape {}, expected [N, {}, H, W] with H, W >= 4",
             x.defined() ? shape_str(x.shape()) : std::string("undefined"), in_channels);
  return (*classifier)((*features)(x));
}

std::shared_ptr<nn::Module> small_cnn(int64_t num_classes, int64_t in_channels, int64_t width) {
  return std::make_shared<SmallCNN>(num_classes, in_channels, width);
}

}  // namespace duet::models
