// nn::Module and the layers: parameter trees and names, modes, in-place moves, freezing,
// initialisation, memory tags and profiler scopes.
#include <algorithm>
#include <cmath>
#include <optional>
#include "engine/autocast.h"
#include "engine/frozen_copies.h"
#include "engine/nn/layers.h"
#include "engine/profiler/events.h"
#include "engine/serialize.h"
#include "engine/optim/optimizer.h"
#include "models/mlp.h"
#include "models/small_cnn.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::all_close;

namespace {
std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

Tensor images(int64_t n, int64_t c, int64_t h, int64_t w, uint64_t seed, DType dt = DType::f32) {
  return duet::testing::random_tensor({n, c, h, w}, seed, dt, -1.0, 1.0);
}

// A module that registers things by hand, to test the registration rules.
class Probe : public nn::Module {
public:
  Tensor forward(const Tensor& x) override { return x; }
  Tensor add_param(const std::string& n, Tensor t) { return register_parameter(n, std::move(t)); }
  Tensor add_buffer(const std::string& n, Tensor t) { return register_buffer(n, std::move(t)); }
};
}  // namespace

TEST(Module, SmallCnnParameterNamesAndCounts) {
  auto model = models::small_cnn(10);
  const auto params = model->named_parameters();
  const std::vector<std::string> expected{
      "features.0.weight", "features.1.weight", "features.1.bias", "features.4.weight", "features.5.weight",
      "features.5.bias",   "features.8.weight", "features.9.weight", "features.9.bias",  "classifier.weight",
      "classifier.bias"};
  EXPECT_EQ(names_of(params), expected);
  EXPECT_EQ(params[0].second.shape(), (Shape{16, 3, 3, 3}));
  EXPECT_EQ(params[3].second.shape(), (Shape{32, 16, 3, 3}));
  EXPECT_EQ(params[9].second.shape(), (Shape{10, 64}));
  // 16*27 + 2*16 + 32*144 + 2*32 + 64*288 + 2*64 + 64*10 + 10
  EXPECT_EQ(model->num_parameters(), 24346);
  for (const auto& [n, p] : params) {
    EXPECT_TRUE(p.requires_grad()) << n;
    EXPECT_TRUE(p.is_leaf()) << n;
  }

  const auto buffers = model->named_buffers();
  ASSERT_EQ(buffers.size(), 9u);
  EXPECT_EQ(buffers[0].first, "features.1.running_mean");
  EXPECT_EQ(buffers[1].first, "features.1.running_var");
  EXPECT_EQ(buffers[2].first, "features.1.num_batches_tracked");
  EXPECT_EQ(buffers[2].second.dtype(), DType::i64);
  EXPECT_EQ(buffers[2].second.dim(), 0);

  const auto modules = model->named_modules();
  EXPECT_EQ(modules[0].first, "");
  EXPECT_EQ(modules[1].first, "features");
  EXPECT_EQ(modules[2].first, "features.0");
  EXPECT_EQ(modules.back().first, "classifier");

  const Tensor y = (*model)(images(2, 3, 12, 10, 1));
  EXPECT_EQ(y.shape(), (Shape{2, 10}));
}

TEST(Module, PrintsLikePyTorch) {
  auto model = models::small_cnn(10);
  const std::string s = model->str();
  EXPECT_NE(s.find("SmallCNN(\n  (features): Sequential(\n    (0): Conv2d(3, 16, kernel_size=(3, 3), stride=(1, 1), "
                   "padding=(1, 1), bias=False)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("(1): BatchNorm2d(16, eps=1e-05, momentum=0.1, affine=True, track_running_stats=True)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("(2): ReLU()"), std::string::npos) << s;
  EXPECT_NE(s.find("(3): MaxPool2d(kernel_size=2, stride=2, padding=0, dilation=1, ceil_mode=False)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("(classifier): Linear(in_features=64, out_features=10, bias=True)\n)"), std::string::npos) << s;
}

TEST(Module, MlpShapesAndNames) {
  auto model = models::mlp(3 * 4 * 4, 5, 32, 3);
  EXPECT_EQ(names_of(model->named_parameters()),
            (std::vector<std::string>{"layers.0.weight", "layers.0.bias", "layers.2.weight", "layers.2.bias",
                                      "layers.4.weight", "layers.4.bias", "layers.6.weight", "layers.6.bias"}));
  EXPECT_EQ((*model)(images(7, 3, 4, 4, 2)).shape(), (Shape{7, 5}));
  EXPECT_THROW((*model)(images(7, 3, 5, 4, 2)), Error);
}

TEST(Module, TrainEvalSwitchChangesBatchNorm) {
  nn::BatchNorm2d bn(3);
  const Tensor x = add(mul(images(4, 3, 5, 5, 3), 2.0), 1.5);  // mean ~1.5, far from the running mean 0
  ASSERT_TRUE(bn.is_training());
  const Tensor y_train = bn(x);
  // Training: normalised with the batch's own statistics.
  const std::vector<double> m = mean(y_train, {0, 2, 3}).to_vector<double>();
  for (double v : m) EXPECT_NEAR(v, 0.0, 1e-5);
  EXPECT_EQ(static_cast<int64_t>(bn.num_batches_tracked.item()), 1);
  // Running mean moved 10% of the way to the batch mean (PyTorch's momentum rule).
  const Tensor batch_mean = mean(x, {0, 2, 3});
  EXPECT_TRUE(all_close(bn.running_mean, mul(batch_mean, 0.1), 1e-5, 1e-4));

  bn.eval();
  EXPECT_FALSE(bn.is_training());
  const Tensor rm = bn.running_mean.clone(), rv = bn.running_var.clone();
  const Tensor y_eval = bn(x);
  // Eval: the running statistics, which stay put.
  const Tensor expected = div(sub(x, rm.view({1, 3, 1, 1})), sqrt(add(rv.view({1, 3, 1, 1}), 1e-5)));
  EXPECT_TRUE(all_close(y_eval, expected, 1e-5, 1e-4));
  EXPECT_TRUE(all_close(bn.running_mean, rm, 0, 0));
  EXPECT_EQ(static_cast<int64_t>(bn.num_batches_tracked.item()), 1);

  // eval() reaches nested modules.
  auto model = models::small_cnn(4);
  model->eval();
  for (const auto& [n, m2] : model->named_modules()) EXPECT_FALSE(m2->is_training()) << n;
  model->train();
  for (const auto& [n, m2] : model->named_modules()) EXPECT_TRUE(m2->is_training()) << n;
}

TEST(Module, ToDtypeKeepsHandlesValid) {
  auto model = std::make_shared<models::SmallCNN>(4, 3, 4);
  const Tensor w = model->classifier->weight;  // a handle held elsewhere, as an optimizer would
  const std::vector<float> before = w.to_vector<float>();
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  model->to(DType::f64);
  EXPECT_EQ(w.dtype(), DType::f64);
  EXPECT_TRUE(w.same(model->classifier->weight));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_EQ(w.to_vector<float>(), before);  // f32 -> f64 is exact
  for (const auto& [n, b] : model->named_buffers())
    EXPECT_EQ(b.dtype(), n.ends_with("num_batches_tracked") ? DType::i64 : DType::f64) << n;

  // The whole model now computes in f64 (on the reference loops: oneDNN computes in f32), and the
  // optimizer updates the moved parameters.
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  const Tensor x = images(3, 3, 8, 8, 4, DType::f64);
  const Tensor loss = cross_entropy((*model)(x), Tensor::from_vector<int64_t>({0, 1, 2}, {3}));
  EXPECT_EQ(loss.dtype(), DType::f64);
  loss.backward();
  EXPECT_EQ(w.grad().dtype(), DType::f64);
  opt.step();
  EXPECT_NE(w.to_vector<double>()[0], static_cast<double>(before[0]));
  EXPECT_THROW(model->to(DType::i64), Error);
}

// model.to(channels_last), as in PyTorch: the convolution weights, their gradients and the
// optimizer's state share one layout, training gives the contiguous model's numbers, and no step
// copies a weight or a weight gradient to change its layout. The conversion happens after the
// first step, so the optimizer's state made in the old layout has to follow.
TEST(Module, ChannelsLastModelTrainsLikeTheContiguousOneWithoutWeightCopies) {
  for (const bool adam : {false, true}) {
    SCOPED_TRACE(adam ? "Adam" : "SGD");
    manual_seed(11);
    auto a = std::make_shared<models::SmallCNN>(4, 3, 8);
    manual_seed(11);
    auto b = std::make_shared<models::SmallCNN>(4, 3, 8);
    const auto make_opt = [adam](const nn::Module& m) -> std::unique_ptr<optim::Optimizer> {
      if (adam) return std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 1e-2, .weight_decay = 1e-3});
      return std::make_unique<optim::SGD>(m.parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
    };
    const auto opt_a = make_opt(*a), opt_b = make_opt(*b);
    std::vector<std::string> weight_shapes;  // the 3x3 kernels, whose two layouts differ
    for (const Tensor& p : b->parameters())
      if (p.dim() == 4) weight_shapes.push_back(shape_str(p.shape()));
    ASSERT_FALSE(weight_shapes.empty());

    const Tensor labels = Tensor::from_vector<int64_t>({0, 1, 2, 3, 1}, {5});
    for (int step = 0; step < 3; ++step) {
      const Tensor x = images(5, 3, 8, 8, 40 + static_cast<uint64_t>(step));
      cross_entropy((*a)(x), labels).backward();
      opt_a->step();
      a->zero_grad();

      if (step == 1) b->to(MemoryFormat::channels_last);
      const bool last = step == 2;  // step 1 moves the optimizer's state once, by design
      profiler::clear();
      profiler::enable(last);
      cross_entropy((*b)(x.contiguous(b->parameters()[0].suggest_memory_format())), labels).backward();
      opt_b->step();
      profiler::enable(false);
      for (const OpEvent& e : profiler::collect())
        for (const std::string& ws : weight_shapes)
          EXPECT_FALSE(std::string(e.name) == "copy" && e.shapes.find(ws) != std::string::npos)
              << "a copy of a weight-shaped tensor in phase " << static_cast<int>(e.phase) << ": " << e.shapes;
      profiler::clear();
      if (step >= 1) {
        for (const Tensor& p : b->parameters()) {
          if (p.dim() != 4) continue;
          EXPECT_TRUE(p.is_contiguous(MemoryFormat::channels_last) && !p.is_contiguous()) << shape_str(p.strides());
          EXPECT_EQ(p.grad().strides(), p.strides());
        }
        const std::vector<Tensor> params = b->parameters();
        for (const auto& [name, t] : opt_b->state_tensors()) {
          if (t.dim() == 0) continue;  // step counts
          const size_t index = std::stoul(name.substr(6, name.find('.', 6) - 6));  // "state.<index>.<buffer>"
          EXPECT_EQ(t.strides(), params[index].strides()) << name;
        }
      }
      b->zero_grad();
    }
    const auto pa = a->named_parameters(), pb = b->named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(all_close(pa[i].second, pb[i].second, 1e-5, 1e-4)) << pa[i].first;
    // And back: the contiguous layout is one call away.
    b->to(MemoryFormat::contiguous);
    for (const Tensor& p : b->parameters()) EXPECT_TRUE(p.is_contiguous());
  }
}

TEST(Module, ZeroGradDropsGradients) {
  auto model = models::mlp(6, 3, 8, 1);
  const Tensor x = duet::testing::random_tensor({4, 6}, 5, DType::f32);
  sum((*model)(x)).backward();
  for (const auto& [n, p] : model->named_parameters()) EXPECT_TRUE(p.grad().defined()) << n;
  model->zero_grad();
  for (const auto& [n, p] : model->named_parameters()) EXPECT_FALSE(p.grad().defined()) << n;
}

TEST(Module, RequiresGradFalseFreezes) {
  auto model = std::make_shared<models::SmallCNN>(4, 3, 4);
  model->features->requires_grad_(false);
  optim::SGD opt(model->parameters(), {.lr = 0.5, .momentum = 0.9});
  const Tensor frozen_before = model->features->named_parameters()[0].second.clone();
  const Tensor head_before = model->classifier->weight.clone();
  const Tensor loss = cross_entropy((*model)(images(4, 3, 8, 8, 6)), Tensor::from_vector<int64_t>({0, 1, 2, 3}, {4}));
  loss.backward();
  for (const auto& [n, p] : model->features->named_parameters()) {
    EXPECT_FALSE(p.requires_grad()) << n;
    EXPECT_FALSE(p.grad().defined()) << n;
  }
  EXPECT_TRUE(model->classifier->weight.grad().defined());
  opt.step();
  EXPECT_TRUE(all_close(model->features->named_parameters()[0].second, frozen_before, 0, 0));
  EXPECT_FALSE(all_close(model->classifier->weight, head_before, 0, 0));
}

TEST(Module, DefaultInitialisationFollowsTorch) {
  manual_seed(7);
  nn::Linear fc(256, 64);
  const double bound = 1.0 / std::sqrt(256.0);  // kaiming_uniform(a=sqrt(5)) on fan_in 256
  double lo = 1, hi = -1;
  for (double v : fc.weight.to_vector<double>()) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -0.95 * bound);
  EXPECT_GT(hi, 0.95 * bound);
  for (double v : fc.bias.to_vector<double>()) EXPECT_LE(std::abs(v), bound);

  nn::Conv2d conv(8, 16, 3);
  EXPECT_EQ(nn::fan_in(conv.weight), 72);
  EXPECT_EQ(nn::fan_out(conv.weight), 144);
  for (double v : conv.weight.to_vector<double>()) EXPECT_LE(std::abs(v), 1.0 / std::sqrt(72.0));

  nn::BatchNorm2d bn(5);
  EXPECT_EQ(bn.weight.to_vector<float>(), std::vector<float>(5, 1.0f));
  EXPECT_EQ(bn.bias.to_vector<float>(), std::vector<float>(5, 0.0f));
  EXPECT_EQ(bn.running_var.to_vector<float>(), std::vector<float>(5, 1.0f));

  // Same seed, same weights.
  manual_seed(7);
  nn::Linear again(256, 64);
  EXPECT_TRUE(all_close(again.weight, fc.weight, 0, 0));

  const Tensor t = Tensor::empty({4000});
  nn::trunc_normal_(t, 0.02);
  double sq = 0;
  for (double v : t.to_vector<double>()) {
    EXPECT_LE(std::abs(v), 0.04 + 1e-7);
    sq += v * v;
  }
  EXPECT_NEAR(std::sqrt(sq / 4000), 0.02 * 0.88, 0.002);  // the std of N(0,1) truncated at +-2 is 0.88
  EXPECT_THROW(nn::fan_in(Tensor::empty({3})), Error);
}

TEST(Module, ParametersAreCountedAsParameterMemory) {
  const auto tag_bytes = [](MemTag t) { return cpu_allocator().stats().by_tag[static_cast<int>(t)]; };
  const int64_t before = tag_bytes(MemTag::parameter);
  auto model = models::small_cnn(10);
  int64_t expected = 0;
  for (const auto& [n, p] : model->named_parameters()) expected += static_cast<int64_t>(p.nbytes());
  for (const auto& [n, b] : model->named_buffers()) expected += static_cast<int64_t>(b.nbytes());
  EXPECT_EQ(tag_bytes(MemTag::parameter) - before, expected);

  // A tensor made elsewhere is retagged when registered.
  Probe probe;
  const Tensor t = Tensor::zeros({100});
  const int64_t mid = tag_bytes(MemTag::parameter);
  probe.add_param("w", t);
  EXPECT_EQ(tag_bytes(MemTag::parameter) - mid, 400);
}

TEST(Module, RegistrationErrors) {
  Probe probe;
  probe.add_param("w", Tensor::zeros({2}));
  EXPECT_THROW(probe.add_param("w", Tensor::zeros({2})), Error);
  EXPECT_THROW(probe.add_param("a.b", Tensor::zeros({2})), Error);
  EXPECT_THROW(probe.add_param("i", Tensor::zeros({2}, DType::i64)), Error);
  const Tensor leaf = Tensor::zeros({2}, TensorOptions().with_grad(true));
  EXPECT_THROW(probe.add_param("y", mul(leaf, 2.0)), Error);
  probe.add_buffer("b", Tensor::zeros({2}));
  EXPECT_THROW(probe.add_buffer("b", Tensor::zeros({2})), Error);
  EXPECT_THROW(nn::Conv2d(3, 4, 3, {.groups = 2}), Error);
  EXPECT_THROW(nn::BatchNorm2d(3)(images(2, 4, 3, 3, 1)), Error);
}

TEST(Module, ProfilerScopesNameTheLayer) {
  auto model = models::small_cnn(4, 3, 4);
  model->named_modules();
  profiler::clear();
  profiler::enable(true);
  const Tensor loss = cross_entropy((*model)(images(2, 3, 8, 8, 9)), Tensor::from_vector<int64_t>({0, 1}, {2}));
  loss.backward();
  profiler::enable(false);
  bool conv_fwd = false, conv_bwd = false, fc = false;
  for (const OpEvent& e : profiler::collect()) {
    const std::string name = e.name;
    if (name == "conv2d" && e.scope == "features.4") conv_fwd = true;
    if (name.starts_with("conv2d.backward") && e.scope == "features.4") conv_bwd = true;
    if (name == "linear" && e.scope == "classifier") fc = true;
  }
  profiler::clear();
  EXPECT_TRUE(conv_fwd);
  EXPECT_TRUE(conv_bwd) << "backward ops should be attributed to the forward's module";
  EXPECT_TRUE(fc);
}

TEST(Module, BatchNormForwardActIsTheFusedPair) {
  // Values and gradients equal act(bn(x)) for ReLU and ReLU6; one "batch_norm+relu(6)" op in the
  // module's scope, and the running statistics move exactly as with the unfused pair.
  for (const Activation act : {Activation::relu, Activation::relu6}) {
    SCOPED_TRACE(activation_name(act));
    struct Net : nn::Module {
      std::shared_ptr<nn::BatchNorm2d> bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
      bool fused = true;
      Activation act = Activation::relu;
      Tensor forward(const Tensor& x) override { return fused ? bn->forward_act(x, act) : activation(act, (*bn)(x)); }
    };
    Net a, b;
    a.act = b.act = act;
    b.fused = false;
    a.named_modules();
    // A scale of 4 puts some outputs above ReLU6's 6.
    for (Net* n : {&a, &b}) n->bn->weight.fill_(4.0);
    const Tensor x = images(3, 4, 5, 5, 7).contiguous(MemoryFormat::channels_last);
    const Tensor xa = x.detach().set_requires_grad(true), xb = x.detach().set_requires_grad(true);
    profiler::clear();
    profiler::enable(true);
    const Tensor ya = a(xa);
    sum(mul(ya, ya)).backward();
    profiler::enable(false);
    const Tensor yb = b(xb);
    sum(mul(yb, yb)).backward();
    const std::vector<double> values = ya.to_vector<double>();
    EXPECT_GT(std::count_if(values.begin(), values.end(), [](double v) { return v >= 6.0; }), 0)
        << "no output at ReLU6's upper clamp";
    EXPECT_TRUE(all_close(ya, yb, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(xa.grad(), xb.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(a.bn->weight.grad(), b.bn->weight.grad(), 1e-5, 1e-5));
    EXPECT_TRUE(all_close(a.bn->running_var, b.bn->running_var, 1e-6, 1e-6));
    int fused = 0, separate = 0;
    for (const OpEvent& e : profiler::collect()) {
      if (std::string(e.name) == std::string("batch_norm+") + activation_name(act) && e.scope == "bn") ++fused;
      if (std::string(e.name) == activation_name(act)) ++separate;
    }
    profiler::clear();
    EXPECT_EQ(fused, 1);
    EXPECT_EQ(separate, 0);
  }
  nn::BatchNorm2d bn(4);
  EXPECT_ERROR_HAS(bn.forward_act(images(2, 4, 3, 3, 1), Activation::gelu_erf), "gelu", "relu or relu6");
}

// A Sequential runs a BatchNorm2d and the ReLU after it (DenseNet's transitions) as one op in the
// batch norm's scope, with the values and gradients of the two modules run one after the other; a
// batch norm followed by anything else runs alone.
TEST(Module, SequentialFusesBatchNormAndRelu) {
  nn::Sequential seq;
  seq.push_back("norm", std::make_shared<nn::BatchNorm2d>(4));
  seq.push_back("relu", nn::ReLU());
  seq.push_back("pool", std::make_shared<nn::AvgPool2d>(2, 2));
  seq.push_back("norm2", std::make_shared<nn::BatchNorm2d>(4));
  seq.named_modules();
  const Tensor x = images(3, 4, 6, 6, 11).contiguous(MemoryFormat::channels_last);
  const Tensor xa = x.detach().set_requires_grad(true), xb = x.detach().set_requires_grad(true);
  Tensor ya;
  std::string ops;
  for (const OpEvent& e : duet::testing::profiled_events([&] { ya = seq(xa); }))
    ops += std::string(e.name) + "@" + e.scope + " ";
  EXPECT_EQ(ops, "batch_norm+relu@norm avg_pool2d@pool batch_norm@norm2 ");
  sum(mul(ya, ya)).backward();
  Tensor yb = xb;
  for (size_t i = 0; i < seq.size(); ++i) yb = seq[i](yb);
  sum(mul(yb, yb)).backward();
  EXPECT_TRUE(all_close(ya, yb, 1e-6, 1e-6));
  EXPECT_TRUE(all_close(xa.grad(), xb.grad(), 1e-5, 1e-5));
}

TEST(Module, BatchNormForwardAddIsTheFusedTriple) {
  // Values and gradients (input, residual, weight) equal [relu](bn(x) + r); one fused op in the
  // module's scope and no separate add or relu, for both layouts and with and without the ReLU.
  for (const bool act : {true, false}) {
    for (const MemoryFormat f : {MemoryFormat::channels_last, MemoryFormat::contiguous}) {
      SCOPED_TRACE(std::string(act ? "relu " : "no relu ") + (f == MemoryFormat::contiguous ? "nchw" : "nhwc"));
      struct Net : nn::Module {
        std::shared_ptr<nn::BatchNorm2d> bn = register_module("bn", std::make_shared<nn::BatchNorm2d>(4));
        bool fused = true, act = true;
        Tensor r;
        Tensor forward(const Tensor& x) override {
          if (fused) return bn->forward_add(x, r, act ? std::optional(Activation::relu) : std::nullopt);
          const Tensor y = add((*bn)(x), r);
          return act ? relu(y) : y;
        }
      };
      Net a, b;
      a.act = b.act = act;
      b.fused = false;
      a.named_modules();
      const Tensor x = images(3, 4, 5, 5, 7).contiguous(f);
      const Tensor r = images(3, 4, 5, 5, 8).contiguous(f);
      const Tensor xa = x.detach().set_requires_grad(true), xb = x.detach().set_requires_grad(true);
      a.r = r.detach().set_requires_grad(true);
      b.r = r.detach().set_requires_grad(true);
      profiler::clear();
      profiler::enable(true);
      // A loss whose gradient differs per element (and, unlike sum(y * y), accumulates nothing).
      const Tensor wl = images(3, 4, 5, 5, 9);
      const Tensor ya = a(xa);
      sum(mul(ya, wl)).backward();
      profiler::enable(false);
      const Tensor yb = b(xb);
      sum(mul(yb, wl)).backward();
      EXPECT_TRUE(all_close(ya, yb, 1e-6, 1e-6));
      EXPECT_TRUE(all_close(xa.grad(), xb.grad(), 1e-5, 1e-5));
      EXPECT_TRUE(all_close(a.r.grad(), b.r.grad(), 1e-6, 1e-6));
      EXPECT_TRUE(all_close(a.bn->weight.grad(), b.bn->weight.grad(), 1e-5, 1e-5));
      EXPECT_TRUE(all_close(a.bn->running_var, b.bn->running_var, 1e-6, 1e-6));
      int fused = 0, others = 0;
      for (const OpEvent& e : profiler::collect()) {
        const std::string n = e.name;
        if (n == (act ? "batch_norm+add+relu" : "batch_norm+add") && e.scope == "bn") ++fused;
        if (n == "relu" || n == "add" || n == "batch_norm") ++others;
      }
      profiler::clear();
      EXPECT_EQ(fused, 1);
      EXPECT_EQ(others, 0);
    }
  }
}

TEST(Module, BatchNormForwardAddChecksItsResidual) {
  nn::BatchNorm2d bn(4);
  const Tensor x = images(2, 4, 3, 3, 1);
  EXPECT_ERROR_HAS(bn.forward_add(x, images(2, 4, 3, 2, 2), Activation::relu), "residual", "[2, 4, 3, 2]", "[2, 4, 3, 3]");
  EXPECT_ERROR_HAS(bn.forward_add(x, Tensor(), Activation::relu), "residual");
  // A residual of another dtype promotes as add() does (bf16 branch onto an f32 stream).
  const Tensor r = images(2, 4, 3, 3, 2);
  const Tensor y = bn.forward_add(x.to(DType::bf16), r, Activation::relu);
  EXPECT_EQ(y.dtype(), DType::f32);
}

TEST(Module, BatchNormForwardAddWithSyncedStatisticsIsTheSameTriple) {
  // With sum_over_replicas set (one replica: the sums are the local ones), forward_add runs the
  // synced batch norm, then add and relu as ops of their own; the values and gradients are the
  // fused op's.
  nn::BatchNorm2d fused(4), synced(4);
  synced.sum_over_replicas = [](const Tensor& t) { return t; };
  const Tensor x = images(3, 4, 5, 5, 7).contiguous(MemoryFormat::channels_last);
  const Tensor r = images(3, 4, 5, 5, 8).contiguous(MemoryFormat::channels_last);
  const Tensor wl = images(3, 4, 5, 5, 9);
  const Tensor xa = x.detach().set_requires_grad(true), xb = x.detach().set_requires_grad(true);
  const Tensor ra = r.detach().set_requires_grad(true), rb = r.detach().set_requires_grad(true);
  const Tensor ya = fused.forward_add(xa, ra, Activation::relu), yb = synced.forward_add(xb, rb, Activation::relu);
  sum(mul(ya, wl)).backward();
  sum(mul(yb, wl)).backward();
  EXPECT_TRUE(all_close(ya, yb, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(xa.grad(), xb.grad(), 1e-4, 1e-4));
  EXPECT_TRUE(all_close(ra.grad(), rb.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(fused.running_var, synced.running_var, 1e-6, 1e-6));
}

TEST(Module, LayerNormAndSequential) {
  nn::LayerNorm ln(6);
  EXPECT_EQ(ln.extra_repr(), "(6,), eps=1e-05, elementwise_affine=True");
  const Tensor x = duet::testing::random_tensor({2, 3, 6}, 11, DType::f32);
  const Tensor y = ln(x);
  for (double v : mean(y, {-1}).to_vector<double>()) EXPECT_NEAR(v, 0.0, 1e-5);
  EXPECT_THROW(ln(duet::testing::random_tensor({2, 5}, 1, DType::f32)), Error);

  nn::Sequential seq{std::make_shared<nn::Linear>(6, 4), nn::ReLU(), std::make_shared<nn::Linear>(4, 2)};
  EXPECT_EQ(seq.size(), 3u);
  EXPECT_EQ(seq(x).shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(names_of(seq.named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_EQ(seq[1].type_name(), "ReLU");
}

// ---- freezing a model for inference (nn::Module::freeze, Tensor::freeze) -----------------------------

// A frozen tensor cannot be written through duet; unfreezing makes it writable again, and every
// freeze has a number of its own (what caches of its copies key on).
TEST(Freeze, FrozenTensorsRefuseWritesUntilUnfrozen) {
  const Tensor t = Tensor::zeros({4});
  EXPECT_FALSE(t.is_frozen());
  EXPECT_EQ(t.freeze_number(), 0u);
  t.freeze();
  const uint64_t first = t.freeze_number();
  EXPECT_NE(first, 0u);
  EXPECT_ERROR_HAS(t.fill_(1.0), "fill_: the tensor of shape [4] is frozen");
  EXPECT_ERROR_HAS(t.copy_(Tensor::ones({4})), "copy_: the tensor of shape [4] is frozen");
  EXPECT_ERROR_HAS(add_(t, Tensor::ones({4})), "add_: the tensor of shape [4] is frozen");
  EXPECT_ERROR_HAS(t.view({2, 2}).fill_(1.0), "frozen");  // a view shares the storage, and its freeze
  t.unfreeze();
  t.fill_(2.0);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{2, 2, 2, 2}));
  t.freeze();
  EXPECT_NE(t.freeze_number(), first) << "a new freeze, a new number";
}

// A frozen model cannot be trained or loaded into: the optimizer step, load_state_dict and batch
// norm's running statistics in training mode all say so; unfreeze() restores training.
TEST(Freeze, FrozenModelRefusesTrainingAndLoading) {
  auto model = models::small_cnn(10);
  const NamedTensors saved = state_dict(*model);
  model->freeze();
  const Tensor x = images(4, 3, 16, 16, 1);
  model->train();
  EXPECT_ERROR_HAS((*model)(x), "running statistics");
  model->eval();
  const Tensor loss = sum((*model)(x));  // inference runs
  optim::SGD opt(model->parameters(), optim::SgdOptions{.lr = 0.1});
  model->unfreeze();
  model->train();
  sum((*model)(x)).backward();
  model->freeze();
  EXPECT_ERROR_HAS(opt.step(), "frozen");
  EXPECT_ERROR_HAS(load_state_dict(*model, saved), "frozen");
  model->unfreeze();
  opt.step();
  load_state_dict(*model, saved);
  (void)loss;
}

// A KxK convolution over a 1x1 map runs on the cpu backend as a matrix product with the one tap
// that sees the input (planner.h). A frozen weight's tap is kept like its other conversions: the
// second forward copies nothing (it used to copy the tap and pack the copy at every call), the
// bits are the unfrozen layer's, and after unfreeze, a change and a new freeze the new weights'.
TEST(Freeze, OneTapConvolutionKeepsItsFrozenTap) {
  nn::Conv2d conv(32, 16, 3, nn::Conv2dOptions{.padding = 1});
  conv.eval();
  const Tensor x = images(4, 32, 1, 1, 3);
  NoGradGuard no_grad;
  const Tensor plain = conv(x);
  conv.freeze();
  const Tensor first = conv(x);
  profiler::clear();
  profiler::enable(true);
  const Tensor second = conv(x);
  profiler::enable(false);
  int copies = 0, one_tap = 0;
  for (const OpEvent& e : profiler::collect()) {
    copies += std::string(e.name) == "copy";
    one_tap += e.impl.find("one tap") != std::string::npos;
  }
  profiler::clear();
  EXPECT_EQ(copies, 0) << "the frozen tap is kept";
  if (backend_available(Backend::cpu)) EXPECT_EQ(one_tap, 1) << "the cpu backend's planner takes the one-tap path";
  EXPECT_TRUE(all_close(first, plain, 0, 0));
  EXPECT_TRUE(all_close(second, plain, 0, 0));
  conv.unfreeze();
  conv.weight.fill_(0.01);
  const Tensor changed_plain = conv(x);
  conv.freeze();
  EXPECT_TRUE(all_close(conv(x), changed_plain, 0, 0));
  EXPECT_FALSE(all_close(changed_plain, plain, 1e-6, 1e-6));
  conv.unfreeze();
}

namespace {
// resnet-like: a 3x3 convolution with enough pixels for Winograd and a pointwise one.
class FreezeNet : public nn::Module {
public:
  FreezeNet() {
    c1 = register_module("c1", std::make_shared<nn::Conv2d>(16, 32, 3, nn::Conv2dOptions{.padding = 1}));
    c2 = register_module("c2", std::make_shared<nn::Conv2d>(32, 32, 3, nn::Conv2dOptions{.padding = 1}));
    c3 = register_module("c3", std::make_shared<nn::Conv2d>(32, 8, 1));
  }
  Tensor forward(const Tensor& x) override { return (*c3)(relu((*c2)(relu((*c1)(x))))); }
  std::shared_ptr<nn::Conv2d> c1, c2, c3;
};
}  // namespace

// Inference of a frozen model keeps its weights' conversions (autocast's bf16 casts, the cpu
// backend's blocked layouts) from one forward to the next, computes the same bits as the model
// unfrozen, and never serves a copy of old weights: after unfreeze, a change and a new freeze, the
// result is the new weights'.
TEST(Freeze, KeptWeightCopiesGiveTheSameBitsAndNeverStaleOnes) {
  FreezeNet net;
  net.eval();
  net.to(MemoryFormat::channels_last);
  const Tensor x = images(16, 16, 8, 8, 2).contiguous(MemoryFormat::channels_last);
  NoGradGuard no_grad;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16" : "f32");
    auto forward = [&] {
      std::optional<AutocastGuard> amp;
      if (bf16) amp.emplace(DType::bf16);
      return net(x).to(DType::f32);
    };
    const Tensor plain = forward();
    net.freeze();
    const Tensor first = forward();
    profiler::clear();
    profiler::enable(true);
    const Tensor second = forward();
    profiler::enable(false);
    int casts = 0;
    for (const OpEvent& e : profiler::collect()) casts += std::string(e.name) == "cast" && e.shapes.find("[32, 32, 3, 3]") != std::string::npos;
    profiler::clear();
    EXPECT_EQ(casts, 0) << "the frozen weights' bf16 copies are kept";
    // Under autocast the bf16 casts are always kept. In f32 a copy is kept only where oneDNN's
    // kernel on this CPU wants the weights in another layout (blocked on some ISAs, plain on
    // others), so there the bits and the staleness below are what is checked.
    if (bf16) {
      EXPECT_GT(frozen_copies_kept(), 0u);
    }
    EXPECT_TRUE(all_close(first, plain, 0, 0));
    EXPECT_TRUE(all_close(second, plain, 0, 0));
    // A changed weight under a new freeze: the result must be the new weight's, as unfrozen.
    net.unfreeze();
    net.c2->weight.fill_(bf16 ? 0.02 : 0.01);
    net.c3->weight.fill_(bf16 ? 0.03 : 0.04);  // the pointwise one: a matrix product's packed weights
    const Tensor changed_plain = forward();
    net.freeze();
    const Tensor changed_frozen = forward();
    EXPECT_TRUE(all_close(changed_frozen, changed_plain, 0, 0));
    EXPECT_FALSE(all_close(changed_frozen, plain, 1e-6, 1e-6));
    net.unfreeze();
  }
}
