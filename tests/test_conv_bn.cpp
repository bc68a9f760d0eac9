// nn::conv_bn: a convolution with its batch norm, residual and activation. A frozen model in eval
// mode folds the batch norm into the convolution and runs one conv2d with an epilogue; these tests
// hold it to the unfolded model's result on every zoo model with batch norms, show which ops are
// left, and check that a fold is never used where it would be wrong (training, unfrozen, stale).
#include <optional>
#include <string>
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/nn/conv_bn.h"
#include "engine/profiler/events.h"
#include "models/registry.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::closeness;

namespace {

// Batch norms with statistics and affine parameters far from their initial 1 and 0, so that a
// wrong fold (a missing eps, mean or shift) shows in the output.
void perturb_batch_norms(nn::Module& m) {
  uint64_t seed = 100;
  for (auto& [name, mod] : m.named_modules())
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(mod)) {
      const int64_t c = bn->weight.size(0);
      bn->weight.copy_(duet::testing::random_tensor({c}, seed++, DType::f32, 0.5, 1.5));
      bn->bias.copy_(duet::testing::random_tensor({c}, seed++, DType::f32, -0.3, 0.3));
      bn->running_mean.copy_(duet::testing::random_tensor({c}, seed++, DType::f32, -0.5, 0.5));
      bn->running_var.copy_(duet::testing::random_tensor({c}, seed++, DType::f32, 0.5, 2.0));
    }
}

struct Forward {
  Tensor y;
  int batch_norms = 0, convs = 0;  // ops of each kind one forward ran
};
Forward profiled_forward(nn::Module& m, const Tensor& x, bool bf16 = false) {
  profiler::clear();
  profiler::enable(true);
  Forward r;
  {
    std::optional<AutocastGuard> amp;
    if (bf16) amp.emplace(DType::bf16);
    r.y = m(x).to(DType::f32);
  }
  profiler::enable(false);
  for (const OpEvent& e : profiler::collect()) {
    const std::string n = e.name;
    r.batch_norms += n.rfind("batch_norm", 0) == 0;
    r.convs += n.rfind("conv2d", 0) == 0 && n.find(".backward") == std::string::npos;
  }
  profiler::clear();
  return r;
}

struct ZooCase {
  const char* name;
  double width;
  int64_t image;
  // After folding, the batch norms that follow no convolution: DenseNet-121's 58 norm1s (each reads
  // the concatenated features), its 3 transitions' norms and norm5.
  int batch_norms_left;
};

}  // namespace

// Every zoo model with batch norms: the frozen model's logits equal the unfolded model's within f32
// rounding (the folded weights are computed in f64 and rounded once), and the batch norms that
// follow a convolution are gone from the forward.
TEST(ConvBn, FoldedModelsMatchTheUnfoldedOnes) {
  NoGradGuard no_grad;
  for (const ZooCase& c : {ZooCase{"small_cnn", 0.5, 32, 0}, ZooCase{"resnet18_cifar", 0.25, 32, 0},
                           ZooCase{"resnet50_cifar", 0.25, 32, 0}, ZooCase{"resnet18", 0.25, 64, 0},
                           ZooCase{"mobilenet_v2", 0.5, 32, 0}, ZooCase{"mobilenet_v1", 0.5, 32, 0},
                           ZooCase{"densenet121", 0.25, 32, 62}}) {
    SCOPED_TRACE(c.name);
    const auto model = models::create_model(c.name, {.image_size = c.image, .width_mult = c.width});
    perturb_batch_norms(*model);
    model->eval();
    model->to(MemoryFormat::channels_last);
    const Tensor x =
        duet::testing::random_tensor({2, 3, c.image, c.image}, 7, DType::f32).contiguous(MemoryFormat::channels_last);
    const Forward plain = profiled_forward(*model, x);
    model->freeze();
    const Forward folded = profiled_forward(*model, x);
    const Forward again = profiled_forward(*model, x);  // the kept folds
    model->unfreeze();
    EXPECT_GT(plain.batch_norms, c.batch_norms_left);
    EXPECT_EQ(folded.batch_norms, c.batch_norms_left);
    EXPECT_EQ(folded.convs, plain.convs);
    EXPECT_LE(closeness(folded.y, plain.y, 1e-4, 1e-4), 1.0);
    EXPECT_LE(closeness(again.y, folded.y, 0, 0), 1.0);
  }
}

// bf16 under autocast: the folded f32 weights are cast once, the epilogue stays fused in bf16, and
// the logits agree with the unfolded bf16 model's within bf16 rounding.
TEST(ConvBn, FoldedModelUnderBf16Autocast) {
  NoGradGuard no_grad;
  const auto model = models::create_model("resnet18_cifar", {.width_mult = 0.25});
  perturb_batch_norms(*model);
  model->eval();
  model->to(MemoryFormat::channels_last);
  const Tensor x = duet::testing::random_tensor({2, 3, 32, 32}, 8, DType::f32).contiguous(MemoryFormat::channels_last);
  const Forward reference = profiled_forward(*model, x);
  const Forward plain = profiled_forward(*model, x, true);
  model->freeze();
  const Forward folded = profiled_forward(*model, x, true);
  model->unfreeze();
  EXPECT_EQ(folded.batch_norms, 0);
  // Both bf16 runs against the f32 one: the fold adds no error of its own beyond bf16's.
  const double plain_err = closeness(plain.y, reference.y, 0.05, 0.05);
  const double folded_err = closeness(folded.y, reference.y, 0.05, 0.05);
  EXPECT_LE(plain_err, 1.0);
  EXPECT_LE(folded_err, 1.0);
}

// No fold where the batch norm is not a fixed map or a fold could be stale: in training mode, in an
// unfrozen eval model, with gradients wanted through frozen weights, and after a change made between
// two freezes (the new statistics are used, not the first freeze's folds).
TEST(ConvBn, FoldsOnlyFrozenEvalModelsAndNeverServesAStaleFold) {
  nn::Conv2d conv(4, 6, 3, {.padding = 1, .bias = true});
  nn::BatchNorm2d bn(6);
  perturb_batch_norms(bn);
  const Tensor x = duet::testing::random_tensor({2, 4, 5, 5}, 9, DType::f32);
  const Tensor r = duet::testing::random_tensor({2, 6, 5, 5}, 10, DType::f32);
  const auto unfolded = [&] {
    return relu(add(batch_norm(conv2d(x, conv.weight, conv.bias, conv.params), bn.weight, bn.bias, bn.running_mean,
                               bn.running_var, BatchNormParams{.training = false, .eps = bn.eps}),
                    r));
  };
  bn.eval();
  EXPECT_FALSE(nn::folds_batch_norm(conv, bn));  // not frozen
  conv.freeze();
  bn.freeze();
  {
    NoGradGuard no_grad;
    EXPECT_TRUE(nn::folds_batch_norm(conv, bn));
    EXPECT_LE(closeness(nn::conv_bn(conv, bn, x, Activation::relu, r), unfolded(), 1e-5, 1e-5), 1.0);
  }
  EXPECT_FALSE(nn::folds_batch_norm(conv, bn)) << "gradients are wanted through the weights";
  NoGradGuard no_grad;
  bn.unfreeze();
  bn.running_mean.fill_(0.25);
  bn.running_var.fill_(3.0);
  EXPECT_FALSE(nn::folds_batch_norm(conv, bn)) << "the batch norm is no longer frozen";
  bn.freeze();
  EXPECT_LE(closeness(nn::conv_bn(conv, bn, x, Activation::relu, r), unfolded(), 1e-5, 1e-5), 1.0);
  bn.train();
  EXPECT_FALSE(nn::folds_batch_norm(conv, bn)) << "training mode";
  conv.unfreeze();
  bn.unfreeze();
}

// The epilogue's errors name what was wrong.
TEST(ConvBn, EpilogueErrors) {
  const Tensor x = duet::testing::random_tensor({1, 2, 4, 4}, 11, DType::f32);
  const Tensor w = duet::testing::random_tensor({3, 2, 3, 3}, 12, DType::f32);
  EXPECT_ERROR_HAS(conv2d(x, w, Tensor(), {.act = Activation::gelu_erf}), "conv2d", "gelu", "relu or relu6");
  EXPECT_ERROR_HAS(conv2d(x, w, Tensor(), {}, duet::testing::random_tensor({1, 3, 4, 4}, 13, DType::f32)), "conv2d",
                   "residual", "[1, 3, 2, 2]");
  EXPECT_ERROR_HAS(conv2d(x, w, Tensor(), {}, duet::testing::random_tensor({1, 3, 2, 2}, 13, DType::f64)), "conv2d",
                   "residual");
}
