// The zoo's structure: parameter and buffer names, shapes, order and counts equal torchvision's
// (tests/golden/torchvision_specs.json, written by tests/golden/make_model_specs.py), the
// registry, every family's forward and backward at CIFAR size, and the FLOP counter.
#include <algorithm>
#include <filesystem>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include "engine/autocast.h"
#include "engine/serialize.h"
#include "models/convnext.h"
#include "models/densenet.h"
#include "models/mobilenet.h"
#include "models/registry.h"
#include "models/resnet.h"
#include "models/vit.h"
#include "models/blocks.h"
#include "tests/test_support.h"

namespace duet {
namespace {

using nlohmann::json;

const json& specs() {
  static const json j = [] {
    const auto path = std::filesystem::path(DUET_SOURCE_DIR) / "tests" / "golden" / "torchvision_specs.json";
    std::ifstream f(path);
    if (!f) throw Error("cannot open " + path.string());
    return json::parse(f);
  }();
  return j;
}

// Names and shapes in order, as "name [shape]" lines, so a failure shows the first difference.
std::vector<std::string> listing(const std::vector<std::pair<std::string, Tensor>>& tensors) {
  std::vector<std::string> out;
  for (const auto& [n, t] : tensors) out.push_back(n + " " + shape_str(t.shape()));
  return out;
}
std::vector<std::string> listing(const json& entries) {
  std::vector<std::string> out;
  for (const auto& e : entries) out.push_back(e[0].get<std::string>() + " " + shape_str(e[1].get<Shape>()));
  return out;
}

class TorchvisionSpec : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchvisionSpec, NamesShapesAndCountMatchTorchvision) {
  const std::string name = GetParam();
  const json& s = specs().at("models").at(name);
  // torchvision's defaults (1000 classes); init=false skips the slow normal draws of the big models.
  const auto model = models::create_model(name, models::ModelOptions{.init = false});
  const auto params = listing(model->named_parameters()), want_params = listing(s.at("parameters"));
  const auto buffers = listing(model->named_buffers()), want_buffers = listing(s.at("buffers"));
  ASSERT_EQ(params.size(), want_params.size()) << name << ": parameter tensors";
  for (size_t i = 0; i < params.size(); ++i) ASSERT_EQ(params[i], want_params[i]) << name << ": parameter " << i;
  ASSERT_EQ(buffers.size(), want_buffers.size()) << name << ": buffer tensors";
  for (size_t i = 0; i < buffers.size(); ++i) ASSERT_EQ(buffers[i], want_buffers[i]) << name << ": buffer " << i;
  EXPECT_EQ(model->num_parameters(), s.at("num_parameters").get<int64_t>()) << name;
  EXPECT_TRUE(models::model_info(name).torchvision) << name << " should be marked as torchvision's";
}

std::vector<std::string> spec_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : specs().at("models").items()) names.push_back(k);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, TorchvisionSpec, ::testing::ValuesIn(spec_names()),
                         [](const auto& info) { return info.param; });

// The largest torchvision models are checked by count and a hash of the listing (the JSON stays
// small); building them takes seconds and gigabytes (vit_h_14: 2.5 GB), so only on request.
uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

class TorchvisionBigSpec : public ::testing::TestWithParam<std::string> {};

TEST_P(TorchvisionBigSpec, CountAndListingHashMatchTorchvision) {
  if (!std::getenv("DUET_TEST_BIG_MODELS")) GTEST_SKIP() << "set DUET_TEST_BIG_MODELS=1 to build the largest models";
  const std::string name = GetParam();
  const json& s = specs().at("big_models").at(name);
  const auto model = models::create_model(name, models::ModelOptions{.init = false});
  std::string text;
  int64_t tensors = 0;
  for (const auto& line : listing(model->named_parameters())) text += line + "\n", ++tensors;
  text += "--buffers--\n";
  for (const auto& line : listing(model->named_buffers())) text += line + "\n", ++tensors;
  EXPECT_EQ(model->num_parameters(), s.at("num_parameters").get<int64_t>()) << name;
  EXPECT_EQ(tensors, s.at("num_tensors").get<int64_t>()) << name;
  EXPECT_EQ(fmt::format("{:016x}", fnv1a64(text)), s.at("listing_fnv1a64").get<std::string>()) << name;
}

std::vector<std::string> big_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : specs().at("big_models").items()) names.push_back(k);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, TorchvisionBigSpec, ::testing::ValuesIn(big_names()),
                         [](const auto& info) { return info.param; });

// The models torchvision lacks, against timm (tests/golden/timm_specs.json, written by
// tests/golden/make_timm_goldens.py): the parameter count, and every (name, shape) under duet's
// names (timm's mapped by that script, the mapping a timm checkpoint needs).
class TimmSpec : public ::testing::TestWithParam<std::string> {};

const json& timm_specs() {
  static const json j = [] {
    std::ifstream f(std::filesystem::path(DUET_SOURCE_DIR) / "tests" / "golden" / "timm_specs.json");
    if (!f) throw Error("cannot open tests/golden/timm_specs.json");
    return json::parse(f);
  }();
  return j;
}

TEST_P(TimmSpec, NamesShapesAndCountMatchTimm) {
  const std::string name = GetParam();
  const json& s = timm_specs().at("models").at(name);
  const auto model = models::create_model(name, models::ModelOptions{.init = false});
  std::vector<std::string> got = listing(model->named_parameters());
  std::sort(got.begin(), got.end());
  std::vector<std::string> want = listing(s.at("parameters"));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want) << name << " against timm's " << s.at("timm_name").get<std::string>();
  EXPECT_EQ(model->num_parameters(), s.at("num_parameters").get<int64_t>()) << name;
}

std::vector<std::string> timm_names() {
  std::vector<std::string> names;
  for (const auto& [k, v] : timm_specs().at("models").items()) names.push_back(k);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Zoo, TimmSpec, ::testing::ValuesIn(timm_names()), [](const auto& info) { return info.param; });

// ---- registry -------------------------------------------------------------------------------------
TEST(Registry, ListsEveryFamilyAndEveryTorchvisionName) {
  const auto all = models::list_models();
  std::map<std::string, int> families;
  for (const auto& m : all) {
    ++families[m.family];
    EXPECT_FALSE(m.description.empty()) << m.name;
    EXPECT_GT(m.default_image_size, 0) << m.name;
    EXPECT_GT(m.default_num_classes, 0) << m.name;
    EXPECT_EQ(models::model_info(m.name).name, m.name);
  }
  for (const char* f : {"resnet", "densenet", "mobilenet", "vit", "convnext", "small_cnn", "mlp"})
    EXPECT_GT(families[f], 0) << f;
  for (const auto& name : spec_names()) {
    bool found = false;
    for (const auto& m : all) found = found || (m.name == name && m.torchvision);
    EXPECT_TRUE(found) << name << " is not listed under its torchvision name";
  }
  // Pattern names resolve without being listed.
  EXPECT_EQ(models::model_info("vit_small_p8").default_image_size, 32);
  EXPECT_EQ(models::model_info("vit_base_p32").default_image_size, 224);
}

TEST(Registry, UnknownNamesAndBadOptionsAreClearErrors) {
  try {
    models::create_model("resnet19");
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'resnet19'"), std::string::npos) << msg;
    for (const char* known : {"resnet18", "densenet121", "mobilenet_v2", "vit_b_16", "convnext_tiny", "small_cnn", "mlp"})
      EXPECT_NE(msg.find(known), std::string::npos) << msg;
  }
  EXPECT_THROW(models::create_model("resnet18", {.width_mult = 0}), Error);
  EXPECT_THROW(models::create_model("resnet18", {.patch_size = 4}), Error);  // ViT only
  EXPECT_THROW(models::create_model("vit_tiny_p4", {.image_size = 30}), Error);  // not a multiple of the patch
  EXPECT_THROW(models::create_model("vit_tiny_p4", {.patch_size = 3}), Error);
}

TEST(Registry, OptionsReachTheModel) {
  auto m = models::create_model("resnet18_cifar", {.num_classes = 7, .width_mult = 0.5, .in_channels = 1, .init = false});
  const auto params = m->named_parameters();
  EXPECT_EQ(params.front().second.shape(), (Shape{32, 1, 3, 3}));  // CIFAR stem, 1 channel, width 32
  EXPECT_EQ(params.back().second.shape(), (Shape{7}));
  auto v = models::create_model("vit_tiny_p4", {.image_size = 64, .patch_size = 8, .init = false});
  for (const auto& [n, p] : v->named_parameters())
    if (n == "encoder.pos_embedding") {
      EXPECT_EQ(p.shape(), (Shape{1, 65, 192}));
    }
  EXPECT_EQ(models::create_model("mlp", {.image_size = 8, .in_channels = 1})->named_parameters().front().second.shape(),
            (Shape{128, 64}));
}

// ---- every family runs forward and backward at CIFAR size ---------------------------------------
struct Case {
  std::string name;
  models::ModelOptions options;
};

class FamilyAtCifarSize : public ::testing::TestWithParam<Case> {};

TEST_P(FamilyAtCifarSize, ForwardAndBackward) {
  const Case& c = GetParam();
  manual_seed(7);
  auto model = models::create_model(c.name, c.options);
  const int64_t size = c.options.image_size > 0 ? c.options.image_size : models::model_info(c.name).default_image_size;
  const Tensor x = testing::random_tensor({2, 3, size, size}, 11, DType::f32);
  const Tensor labels = Tensor::from_vector<int64_t>({1, 2}, {2});
  model->train();
  const Tensor logits = (*model)(x);
  ASSERT_EQ(logits.shape(), (Shape{2, 10}));
  const Tensor loss = cross_entropy(logits, labels);
  EXPECT_TRUE(std::isfinite(loss.item()));
  loss.backward();
  for (const auto& [n, p] : model->named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << c.name << ": " << n << " got no gradient";
    EXPECT_EQ(p.grad().shape(), p.shape()) << n;
  }
  model->eval();
  NoGradGuard no_grad;
  const Tensor eval_logits = (*model)(x);
  EXPECT_EQ(eval_logits.shape(), (Shape{2, 10}));
  for (double v : eval_logits.to_vector<double>()) EXPECT_TRUE(std::isfinite(v));
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, FamilyAtCifarSize,
    ::testing::Values(Case{"resnet18_cifar", {.num_classes = 10, .width_mult = 0.25}},
                      Case{"resnet50_cifar", {.num_classes = 10, .width_mult = 0.125}},
                      Case{"resnet18", {.num_classes = 10, .image_size = 32, .width_mult = 0.25}},
                      Case{"densenet121", {.num_classes = 10, .image_size = 32, .width_mult = 0.25}},
                      Case{"mobilenet_v1", {.num_classes = 10, .image_size = 32, .width_mult = 0.25}},
                      Case{"mobilenet_v2", {.num_classes = 10, .image_size = 32, .width_mult = 0.25}},
                      Case{"vit_tiny_p4", {.num_classes = 10, .width_mult = 0.25}},
                      Case{"convnext_tiny", {.num_classes = 10, .image_size = 32, .width_mult = 0.25}},
                      Case{"small_cnn", {}}, Case{"mlp", {}}),
    [](const auto& info) { return info.param.name; });

// The ImageNet stem takes 32x32 down to 1x1 before the last dense block: every map stays >= 1.
TEST(DenseNet, FullWidthDenseNet121RunsOn32x32) {
  models::DenseNetConfig cfg = models::densenet_config("densenet121", 10);
  cfg.init = false;
  models::DenseNet net(cfg);
  net.eval();
  NoGradGuard no_grad;
  const Tensor x = testing::random_tensor({1, 3, 32, 32}, 3, DType::f32);
  EXPECT_EQ((*net.features)(x).shape(), (Shape{1, 1024, 1, 1}));
  EXPECT_EQ(net(x).shape(), (Shape{1, 10}));
}

// A dense block that records no graph writes each layer's channels once into the block's output
// and hands each layer a slice of it (models/densenet.cpp): no cat, one copy per layer and one for
// the block's input, and the bits of the running concatenation, unfrozen and frozen (batch norms
// folded into the convolutions), f32 and under bf16 autocast.
TEST(DenseNet, InferenceWritesEachLayersChannelsOnce) {
  models::DenseNet net(models::densenet_config("densenet121", 10, 0.25));
  net.eval();
  net.to(MemoryFormat::channels_last);
  std::shared_ptr<nn::Module> second;
  for (const auto& [name, m] : net.features->children())
    if (name == "denseblock2") second = m;
  ASSERT_TRUE(second);
  auto& block = dynamic_cast<models::DenseBlock&>(*second);
  const int64_t in = block.layers[0]->norm1->weight.size(0);
  const Tensor x = testing::random_tensor({2, in, 8, 8}, 9, DType::f32).contiguous(MemoryFormat::channels_last);
  NoGradGuard no_grad;
  // f32 maps under bf16 autocast: the layers' bf16 outputs are not the block's dtype, so the block
  // falls back to the concatenation from its first layer on (cat promotes to f32).
  struct Case {
    bool frozen, bf16, f32_maps;
  };
  for (const Case k : {Case{false, false, false}, Case{false, true, false}, Case{true, false, false},
                       Case{true, true, false}, Case{false, true, true}}) {
    const bool frozen = k.frozen, bf16 = k.bf16;
    SCOPED_TRACE(std::string(frozen ? "frozen" : "unfrozen") + (bf16 ? " bf16" : " f32") +
                 (k.f32_maps ? " f32 maps" : ""));
    if (frozen) net.freeze();
    std::optional<AutocastGuard> amp;
    if (bf16) amp.emplace(DType::bf16);
    const Tensor xin = bf16 && !k.f32_maps ? x.to(DType::bf16) : x;
    Tensor concatenated = xin;
    for (const auto& layer : block.layers) concatenated = cat({concatenated, (*layer)(concatenated)}, 1);
    Tensor y;
    int cats = 0, copies = 0;
    for (const OpEvent& e : testing::profiled_events([&] { y = block(xin); })) {
      cats += std::string(e.name) == "cat";
      copies += std::string(e.name) == "copy";
    }
    amp.reset();
    if (frozen) net.unfreeze();
    const int layers = static_cast<int>(block.layers.size());
    EXPECT_EQ(cats, k.f32_maps ? layers : 0);
    EXPECT_EQ(copies, k.f32_maps ? 1 : layers + 1);
    if (!k.f32_maps) EXPECT_TRUE(y.is_contiguous(MemoryFormat::channels_last));
    const Tensor a = y.contiguous(), b = concatenated.contiguous();
    ASSERT_EQ(a.shape(), b.shape());
    ASSERT_EQ(a.dtype(), b.dtype());
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  }
}

TEST(ConvNeXt, StochasticDepthDropsWholeSamplesInTrainingOnly) {
  models::StochasticDepth sd(0.5);
  const Tensor x = Tensor::ones({64, 2, 3, 3});
  sd.train();
  const std::vector<float> y = sd(x).to_vector<float>();
  int dropped = 0;
  for (int64_t n = 0; n < 64; ++n) {
    const float v = y[n * 18];
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;
    for (int64_t i = 1; i < 18; ++i) EXPECT_EQ(y[n * 18 + i], v);  // the whole sample
    dropped += v == 0.0f;
  }
  EXPECT_GT(dropped, 10);
  EXPECT_LT(dropped, 54);
  sd.eval();
  EXPECT_TRUE(sd(x).same(x));
}

TEST(MobileNet, MakeDivisibleIsTorchvisions) {
  // _make_divisible(v, 8) values from torchvision.
  EXPECT_EQ(models::make_divisible(32 * 0.25), 8);
  EXPECT_EQ(models::make_divisible(16 * 0.35), 8);
  EXPECT_EQ(models::make_divisible(24 * 0.75), 24);
  EXPECT_EQ(models::make_divisible(96 * 1.4), 136);
  EXPECT_EQ(models::make_divisible(1280 * 1.4), 1792);
  EXPECT_EQ(models::make_divisible(60.0), 64);
  EXPECT_EQ(models::make_divisible(11.0), 16);  // 8 would be more than 10% below 11
}

// Conv2dNormActivation with ReLU6 (MobileNetV2's): the activation runs inside the batch norm's pass
// with the unfused trio's values and gradients; torchvision's child names stay; an activation
// batch norm cannot fuse (Hardswish) runs as its own module.
TEST(MobileNet, ConvBnActFusesReluSixIntoTheBatchNorm) {
  auto fused = models::conv_bn_act(4, 8, 3, 1, 1, Activation::relu6);
  auto plain = models::conv_bn_act(4, 8, 3, 1, 1, Activation::relu6);
  const auto src = fused->named_parameters(), dst = plain->named_parameters();
  for (size_t i = 0; i < src.size(); ++i) dst[i].second.copy_(src[i].second);
  fused->named_modules();
  for (auto* m : {fused.get(), plain.get()}) m->bn->weight.fill_(4.0);  // some outputs above 6
  std::vector<std::string> names;
  for (const auto& [n, p] : fused->named_parameters()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "1.weight", "1.bias"}));
  const Tensor x = testing::random_tensor({2, 4, 6, 6}, 5, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor wl = testing::random_tensor({2, 8, 6, 6}, 6, DType::f32);
  const Tensor xa = x.detach().set_requires_grad(true), xb = x.detach().set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  const Tensor ya = (*fused)(xa);
  sum(mul(ya, wl)).backward();
  profiler::enable(false);
  const Tensor yb = relu6((*plain->bn)((*plain->conv)(xb)));
  sum(mul(yb, wl)).backward();
  const std::vector<double> values = ya.to_vector<double>();
  EXPECT_GT(std::count(values.begin(), values.end(), 6.0), 0) << "no output at ReLU6's upper clamp";
  EXPECT_TRUE(testing::all_close(ya, yb, 1e-6, 1e-6));
  EXPECT_TRUE(testing::all_close(xa.grad(), xb.grad(), 1e-5, 1e-5));
  EXPECT_TRUE(testing::all_close(fused->conv->weight.grad(), plain->conv->weight.grad(), 1e-4, 1e-5));
  EXPECT_TRUE(testing::all_close(fused->bn->weight.grad(), plain->bn->weight.grad(), 1e-4, 1e-5));
  int fused_ops = 0, separate = 0;
  for (const OpEvent& e : profiler::collect()) {
    if (std::string(e.name) == "batch_norm+relu6" && e.scope == "1") ++fused_ops;
    if (std::string(e.name) == "relu6") ++separate;
  }
  profiler::clear();
  EXPECT_EQ(fused_ops, 1);
  EXPECT_EQ(separate, 0);

  auto hs = models::conv_bn_act(4, 8, 3, 1, 1, Activation::hardswish);
  profiler::enable(true);
  (void)(*hs)(x);
  profiler::enable(false);
  int hardswish = 0;
  for (const OpEvent& e : profiler::collect()) hardswish += std::string(e.name) == "hardswish";
  profiler::clear();
  EXPECT_EQ(hardswish, 1);
}

// ---- parameter count and FLOPs ------------------------------------------------------------------
// Expected conv + linear FLOPs from PyTorch forward hooks (2 per multiply-add); duet's profiler
// total adds batch norm, ReLU, pooling and residual adds, a few percent on top.
TEST(ModelStats, ResNet18CountsAndFlops) {
  const models::ModelStats s = models::model_stats("resnet18", {.image_size = 64});
  EXPECT_EQ(s.parameters, 11689512);
  EXPECT_EQ(s.trainable_parameters, 11689512);
  EXPECT_EQ(s.image_size, 64);
  const double conv_linear = 297115648.0;
  EXPECT_GE(s.forward_flops, conv_linear);
  EXPECT_LE(s.forward_flops, 1.03 * conv_linear);
}

TEST(ModelStats, RestoresModeAndProfilerState) {
  auto m = models::create_model("small_cnn");
  m->train();
  ASSERT_FALSE(profiler::enabled());
  const models::ModelStats s = models::model_stats(*m, 32);
  EXPECT_TRUE(m->is_training());
  EXPECT_FALSE(profiler::enabled());
  EXPECT_TRUE(profiler::collect().empty());
  EXPECT_EQ(s.parameters, m->num_parameters());
  EXPECT_GT(s.forward_flops, 0);
  EXPECT_GT(s.buffer_elements, 0);
}

}  // namespace
}  // namespace duet
