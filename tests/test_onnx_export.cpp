// ONNX export (export/onnx_export.h) and `duet export`: every zoo model exports and passes
// onnx::checker; the file is read back with onnx's own classes (opset, dynamic batch, batch norm as
// BatchNormalization, names, metadata); what cannot be exported, a checkpoint of another model and
// outputs that cannot be written are errors that leave no file. ONNX Runtime's numbers against
// duet's are tests/onnx_runtime_check.py's (ctest: onnx.runtime).
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#include <stb/stb_image_write.h>
#include "engine/serialize.h"
#include "export/onnx_export.h"
#include "models/registry.h"
#include "models/small_cnn.h"
#include "tests/cli_support.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::CliResult;
using duet::testing::contains;
using duet::testing::duet_cli;
namespace fs = std::filesystem;

namespace {

using duet::testing::TempDir;

onnx::ModelProto parse(const std::string& bytes) {
  onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(bytes));
  return m;
}

onnx::ModelProto read(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return parse(std::string(std::istreambuf_iterator<char>(f), {}));
}

std::map<std::string, std::string> metadata(const onnx::ModelProto& m) {
  std::map<std::string, std::string> out;
  for (const auto& p : m.metadata_props()) out[p.key()] = p.value();
  return out;
}

int64_t count_ops(const onnx::ModelProto& m, const std::string& op) {
  int64_t n = 0;
  for (const auto& node : m.graph().node()) n += node.op_type() == op;
  return n;
}

int64_t count_modules(nn::Module& model, const std::string& type) {
  int64_t n = 0;
  for (const auto& [name, mod] : model.named_modules()) n += mod->type_name() == type;
  return n;
}

// [dim_param or dim_value, ...] of a graph input or output.
std::vector<std::string> dims(const onnx::ValueInfoProto& v) {
  std::vector<std::string> out;
  for (const auto& d : v.type().tensor_type().shape().dim())
    out.push_back(d.has_dim_param() ? d.dim_param() : std::to_string(d.dim_value()));
  return out;
}

exporter::OnnxExportInfo info_for(const std::string& name) {
  const models::ModelInfo mi = models::model_info(name);
  exporter::OnnxExportInfo i;
  i.model_name = name;
  i.image_size = mi.default_image_size;
  return i;
}

// A module the exporter has no entry for.
struct Doubler final : nn::Module {
  Tensor forward(const Tensor& x) override { return mul(x, 2.0); }
  std::string type_name() const override { return "Doubler"; }
};

// A Conv2d whose forward computes something else: not to be exported as a Conv2d.
struct ShiftedConv final : nn::Conv2d {
  ShiftedConv() : nn::Conv2d(3, 4, 3) {}
  Tensor forward(const Tensor& x) override { return add(nn::Conv2d::forward(x), 1.0); }
};

}  // namespace

// Every model of the zoo at its default input: the graph builds, ONNX's strict shape inference
// agrees with the shapes the exporter tracked, and onnx::checker accepts it; the output is
// [batch, classes] and there is one BatchNormalization node per BatchNorm2d module. Models of more
// than about 12M parameters are built at a quarter of their width (the same modules and graph, a
// sixteenth of the weights: building their full-size weights takes minutes on two cores), unless
// DUET_TEST_BIG_MODELS=1; tests/onnx_runtime_check.py exports every one at full size. A model whose
// weights exceed 1.5 GiB (ViT-H/14) goes through a file, its weights beside it.
TEST(OnnxExport, EveryZooModelExportsAndPassesTheChecker) {
  TempDir dir("zoo");
  const bool big = std::getenv("DUET_TEST_BIG_MODELS") != nullptr;
  for (const models::ModelInfo& mi : models::list_models()) {
    SCOPED_TRACE(mi.name);
    auto model = models::create_model(mi.name, {.width_mult = 0.25, .init = false});
    const bool full = big || model->num_parameters() * 16 <= 12'000'000;
    if (full) model = models::create_model(mi.name, {.init = false});
    const int64_t bytes = model->num_parameters() * 4;
    onnx::ModelProto m;
    if (bytes < (int64_t{3} << 29)) {
      exporter::OnnxExportResult r;
      m = parse(exporter::onnx_model_bytes(*model, info_for(mi.name), &r));
      EXPECT_FALSE(r.external_data);
      EXPECT_EQ(r.output_shape, (std::vector<int64_t>{-1, mi.default_num_classes}));
    } else {
      const std::string path = dir / (mi.name + ".onnx");
      const exporter::OnnxExportResult r = exporter::export_onnx(*model, info_for(mi.name), path);
      EXPECT_TRUE(r.external_data);
      EXPECT_NO_THROW(onnx::checker::check_model(path));  // the path form also checks the data file is there
      EXPECT_GE(static_cast<int64_t>(fs::file_size(r.data_path)), bytes);
      m = read(path);
      fs::remove(path);
      fs::remove(r.data_path);
    }
    EXPECT_EQ(dims(m.graph().output(0)), (std::vector<std::string>{"batch", std::to_string(mi.default_num_classes)}));
    EXPECT_EQ(count_ops(m, "BatchNormalization"), count_modules(*model, "BatchNorm2d"));
    EXPECT_EQ(metadata(m)["model"], mi.name);
  }
}

TEST(OnnxExport, GraphOpsetBatchNormNamesAndMetadata) {
  manual_seed(3);
  models::SmallCNN model(4, 3, 8);
  static_cast<nn::BatchNorm2d&>((*model.features)[1]).running_var.fill_(0.25);  // not a fresh layer's 1
  exporter::OnnxExportInfo i;
  i.model_name = "small_cnn";
  i.image_size = 20;
  i.class_names = {"cat", "dog", "fox", "owl"};
  i.mean = {0.5f, 0.4f, 0.3f};
  i.std = {0.2f, 0.25f, 0.3f};
  i.resize_shorter = 23;
  i.epoch = 7;
  const onnx::ModelProto m = parse(exporter::onnx_model_bytes(model, i));
  EXPECT_NO_THROW(onnx::checker::check_model(m));
  EXPECT_EQ(m.ir_version(), exporter::kOnnxIrVersion);
  ASSERT_EQ(m.opset_import_size(), 1);
  EXPECT_EQ(m.opset_import(0).version(), 17);
  EXPECT_EQ(m.producer_name(), "duet");
  EXPECT_EQ(dims(m.graph().input(0)), (std::vector<std::string>{"batch", "3", "20", "20"}));
  EXPECT_EQ(m.graph().input(0).name(), "input");
  EXPECT_EQ(m.graph().output(0).name(), "logits");
  EXPECT_EQ(dims(m.graph().output(0)), (std::vector<std::string>{"batch", "4"}));
  // Batch norm as BatchNormalization reading the running statistics under torchvision's names.
  std::set<std::string> initializers;
  for (const auto& t : m.graph().initializer()) initializers.insert(t.name());
  for (const char* n : {"features.1.weight", "features.1.bias", "features.1.running_mean", "features.1.running_var",
                               "features.0.weight", "classifier.weight", "classifier.bias"})
    EXPECT_TRUE(initializers.count(n)) << n;
  EXPECT_EQ(count_ops(m, "BatchNormalization"), 3);
  for (const auto& node : m.graph().node()) {
    if (node.op_type() != "BatchNormalization") continue;
    EXPECT_EQ(node.input(3).substr(node.input(3).size() - 12), "running_mean") << node.name();
    for (const auto& a : node.attribute()) {
      if (a.name() == "epsilon") {
        EXPECT_FLOAT_EQ(a.f(), 1e-5f);
      }
    }
  }
  // The running statistics' values, not a fresh layer's.
  for (const auto& t : m.graph().initializer()) {
    if (t.name() != "features.1.running_var") continue;
    ASSERT_EQ(t.raw_data().size(), 8 * sizeof(float));
    EXPECT_FLOAT_EQ(reinterpret_cast<const float*>(t.raw_data().data())[0], 0.25f);
  }
  auto meta = metadata(m);
  EXPECT_EQ(nlohmann::json::parse(meta["class_names"]), nlohmann::json({"cat", "dog", "fox", "owl"}));
  EXPECT_EQ(meta["num_classes"], "4");
  EXPECT_EQ(meta["input_size"], "20");
  EXPECT_EQ(nlohmann::json::parse(meta["mean"]).get<std::vector<float>>(), i.mean);
  EXPECT_EQ(nlohmann::json::parse(meta["std"]).get<std::vector<float>>(), i.std);
  EXPECT_EQ(meta["resize_shorter"], "23");
  EXPECT_EQ(meta["epochs_trained"], "7");
  EXPECT_FALSE(meta["duet_version"].empty());
  EXPECT_TRUE(contains(meta["preprocessing"], "centre-crop 20x20")) << meta["preprocessing"];
}

// The graph is the eval-mode forward whatever mode the model is in, and the mode is given back.
TEST(OnnxExport, TrainingModeModelExportsEvalModeAndKeepsItsMode) {
  auto model = models::create_model("mobilenet_v2", {.num_classes = 3, .width_mult = 0.25});
  model->train();
  const std::string from_train = exporter::onnx_model_bytes(*model, info_for("mobilenet_v2"));
  EXPECT_TRUE(model->is_training());
  model->eval();
  const std::string from_eval = exporter::onnx_model_bytes(*model, info_for("mobilenet_v2"));
  EXPECT_FALSE(model->is_training());
  EXPECT_TRUE(from_train == from_eval) << "the export of a model in training mode differs from its eval-mode export";
}

// A module without a translation: the error names its path and type, and no file appears.
TEST(OnnxExport, ModuleWithoutTranslationIsNamedAndNothingIsWritten) {
  TempDir dir("unknown");
  nn::Sequential model;
  auto body = std::make_shared<nn::Sequential>();
  body->push_back(std::make_shared<nn::Conv2d>(3, 4, 3));
  body->push_back(std::make_shared<Doubler>());
  model.push_back("body", body);
  exporter::OnnxExportInfo i;
  i.model_name = "custom";
  i.image_size = 8;
  EXPECT_ERROR_HAS(exporter::export_onnx(model, i, dir / "m.onnx"), "module 'body.1'", "Doubler",
                   "has no ONNX translation", "Conv2d");
  EXPECT_EQ(dir.files().size(), 0u);

  nn::Sequential lambda;
  lambda.push_back(std::make_shared<nn::Lambda>([](const Tensor& x) { return x; }, "MyGlue"));
  EXPECT_ERROR_HAS(exporter::export_onnx(lambda, i, dir / "m.onnx"), "module '0'", "MyGlue");

  // A subclass is not taken for its base: its forward may compute something else.
  nn::Sequential sub;
  sub.push_back(std::make_shared<ShiftedConv>());
  EXPECT_ERROR_HAS(exporter::onnx_model_bytes(sub, i), "module '0'", "has no ONNX translation");
  EXPECT_EQ(dir.files().size(), 0u);
}

TEST(OnnxExport, BadInfoAndOutputsAreErrorsBeforeAnyFile) {
  TempDir dir("bad");
  models::SmallCNN model(2, 3, 4);
  exporter::OnnxExportInfo i;
  i.model_name = "small_cnn";
  i.image_size = 16;
  const std::string missing = dir / "no-such-folder/m.onnx";
  EXPECT_ERROR_HAS(exporter::export_onnx(model, i, missing), "the folder", "does not exist");
  EXPECT_ERROR_HAS(exporter::export_onnx(model, i, dir.path.string()), "is a folder");
  // /proc takes no new files, not even root's: the write itself fails, after the graph was built.
  EXPECT_ERROR_HAS(exporter::export_onnx(model, i, "/proc/duet-test.onnx"), "/proc/duet-test.onnx");
  EXPECT_FALSE(fs::exists("/proc/duet-test.onnx"));

  exporter::OnnxExportInfo names = i;
  names.class_names = {"a", "b", "c"};
  EXPECT_ERROR_HAS(exporter::export_onnx(model, names, dir / "m.onnx"), "2 outputs but 3 class names");
  exporter::OnnxExportInfo norm = i;
  norm.mean = {0.5f};
  norm.std = {0.5f};
  EXPECT_ERROR_HAS(exporter::export_onnx(model, norm, dir / "m.onnx"), "one value per input channel (3)");
  exporter::OnnxExportInfo size = i;
  size.image_size = 0;
  EXPECT_ERROR_HAS(exporter::export_onnx(model, size, dir / "m.onnx"), "image size 0");
  // ViT's position embedding fixes its input size.
  auto vit = models::create_model("vit_tiny_p4", {.num_classes = 2, .width_mult = 0.25});
  exporter::OnnxExportInfo wrong = info_for("vit_tiny_p4");
  wrong.image_size = 64;
  EXPECT_ERROR_HAS(exporter::export_onnx(*vit, wrong, dir / "m.onnx"), "VisionTransformer for 32x32 images",
                   "[batch, 3, 64, 64]");
  EXPECT_EQ(dir.files().size(), 0u);
}

// Weights over the threshold go to "<file>.data", which the .onnx file names relatively.
TEST(OnnxExport, LargeWeightsGoToAnExternalDataFile) {
  TempDir dir("external");
  const int64_t was = exporter::set_external_data_threshold(1000);
  models::SmallCNN model(2, 3, 4);
  exporter::OnnxExportInfo i;
  i.model_name = "small_cnn";
  i.image_size = 16;
  exporter::OnnxExportResult r;
  try {
    r = exporter::export_onnx(model, i, dir / "m.onnx");
    EXPECT_ERROR_HAS(exporter::onnx_model_bytes(model, i), "do not fit one protobuf message");
  } catch (...) {
    exporter::set_external_data_threshold(was);
    throw;
  }
  exporter::set_external_data_threshold(was);
  ASSERT_TRUE(r.external_data);
  EXPECT_EQ(r.data_path, dir / "m.onnx.data");
  EXPECT_EQ(static_cast<int64_t>(fs::file_size(r.data_path)), r.weight_bytes);
  EXPECT_NO_THROW(onnx::checker::check_model(dir / "m.onnx"));
  const onnx::ModelProto m = read(dir / "m.onnx");
  int64_t external = 0;
  for (const auto& t : m.graph().initializer()) {
    if (t.data_location() != onnx::TensorProto::EXTERNAL) continue;
    ++external;
    EXPECT_EQ(t.external_data(0).key(), "location");
    EXPECT_EQ(t.external_data(0).value(), "m.onnx.data");
  }
  EXPECT_EQ(external, 17);  // small_cnn's parameters and float buffers
  EXPECT_EQ(dir.files().size(), 2u);
}

// ---- duet export ------------------------------------------------------------------------------------

namespace {
// A tiny image folder (2 classes, 4 PNGs each in train/ and test/), for a checkpoint with a transform.
void write_image_folder(const fs::path& root) {
  for (const char* split : {"train", "test"})
    for (const char* cls : {"cat", "dog"}) {
      fs::create_directories(root / split / cls);
      for (int k = 0; k < 4; ++k) {
        std::vector<unsigned char> px(10 * 12 * 3);
        for (size_t j = 0; j < px.size(); ++j) px[j] = static_cast<unsigned char>((j * 37 + k * 11 + cls[0]) % 251);
        const std::string f = (root / split / cls / fmt::format("{}.png", k)).string();
        ASSERT_TRUE(stbi_write_png(f.c_str(), 12, 10, 3, px.data(), 12 * 3)) << f;
      }
    }
}
}  // namespace

TEST(OnnxExportCli, CheckpointWithItsClassesAndNormalisation) {
  TempDir dir("cli");
  write_image_folder(dir.path / "data");
  const std::string ck = dir / "ck.safetensors", out = dir / "catdog.onnx";
  const CliResult t = duet_cli({"train", "--model", "small_cnn", "--width-mult", "0.25", "--dataset", "folder", "--data",
                                dir / "data", "--image-size", "8", "--batch", "4", "--epochs", "1", "--workers", "0",
                                "--checkpoint", ck});
  ASSERT_EQ(t.status, 0) << t.err;
  const CliResult e = duet_cli({"export", "--onnx", out, "-c", ck});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "exported small_cnn from '" + ck + "' (epoch 1)")) << e.out;
  EXPECT_TRUE(contains(e.out, "ONNX opset 17: input [batch, 3, 8, 8] -> logits [batch, 2]")) << e.out;
  EXPECT_TRUE(contains(e.out, "checked by onnx::checker")) << e.out;
  const onnx::ModelProto m = read(out);
  auto meta = metadata(m);
  EXPECT_EQ(nlohmann::json::parse(meta["class_names"]), nlohmann::json({"cat", "dog"}));
  EXPECT_EQ(nlohmann::json::parse(meta["mean"]).get<std::vector<float>>(), (std::vector<float>{0.485f, 0.456f, 0.406f}));
  EXPECT_EQ(nlohmann::json::parse(meta["std"]).get<std::vector<float>>(), (std::vector<float>{0.229f, 0.224f, 0.225f}));
  EXPECT_EQ(meta["resize_shorter"], "9");  // 8/7 of the image size, as `duet predict` resizes
  EXPECT_EQ(meta["source"], ck);

  // A checkpoint of another model than --model names; options the checkpoint fixes.
  const CliResult other = duet_cli({"export", "--onnx", dir / "x.onnx", "-c", ck, "--model", "resnet18"});
  EXPECT_EQ(other.status, 1);
  EXPECT_TRUE(contains(other.err, "holds a small_cnn model (of 2 classes), not a resnet18")) << other.err;
  const CliResult classes = duet_cli({"export", "--onnx", dir / "x.onnx", "-c", ck, "--classes", "5"});
  EXPECT_EQ(classes.status, 1);
  EXPECT_TRUE(contains(classes.err, "--classes does not apply with --checkpoint")) << classes.err;
  // Weights that are not a duet checkpoint (a bare safetensors file, as a torchvision export).
  models::SmallCNN bare(2, 3, 4);
  save_state_dict(dir / "bare.safetensors", bare);
  const CliResult not_ck = duet_cli({"export", "--onnx", dir / "x.onnx", "-c", dir / "bare.safetensors"});
  EXPECT_EQ(not_ck.status, 1);
  EXPECT_TRUE(contains(not_ck.err, "bare.safetensors")) << not_ck.err;
  EXPECT_FALSE(fs::exists(dir / "x.onnx"));
}

TEST(OnnxExportCli, FreshModelsAndBadCommandLines) {
  TempDir dir("fresh");
  const CliResult r = duet_cli({"export", "--onnx", dir / "r.onnx", "--model", "resnet18_cifar", "--classes", "7",
                                "--width-mult", "0.25"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "logits [batch, 7]")) << r.out;
  EXPECT_TRUE(contains(r.out, "BatchNormalization 20")) << r.out;
  EXPECT_EQ(metadata(read(dir / "r.onnx"))["source"], "fresh (randomly initialised weights)");

  const CliResult none = duet_cli({"export", "--onnx", dir / "n.onnx"});
  EXPECT_EQ(none.status, 1);
  EXPECT_TRUE(contains(none.err, "expected --checkpoint FILE")) << none.err;
  const CliResult unknown = duet_cli({"export", "--onnx", dir / "n.onnx", "--model", "resnet9000"});
  EXPECT_EQ(unknown.status, 1);
  EXPECT_TRUE(contains(unknown.err, "unknown model 'resnet9000'")) << unknown.err;
  const std::string missing = dir / "no-such-folder/m.onnx";
  const CliResult folder = duet_cli({"export", "--onnx", missing, "--model", "small_cnn"});
  EXPECT_EQ(folder.status, 1);
  EXPECT_TRUE(contains(folder.err, "--onnx '" + missing + "'")) << folder.err;
  EXPECT_TRUE(contains(folder.err, "does not exist")) << folder.err;
  EXPECT_EQ(folder.out, "");
  EXPECT_NE(duet_cli({"export", "--model", "small_cnn"}).status, 0);  // --onnx is required
  EXPECT_FALSE(fs::exists(dir / "n.onnx"));
}
