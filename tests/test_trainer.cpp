// The trainer of train/: learning-rate schedules at known steps (PyTorch's values), reproducible
// loss curves, resume == uninterrupted training to the bit, checkpoints that survive a kill
// mid-write, the stop on a non-finite loss, top-k and the predict image pipeline, and training a
// tiny model on an image folder then predicting with its checkpoint.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stb/stb_image_write.h>
#include "train/checkpoint.h"
#include "train/lr_schedule.h"
#include "train/model_file.h"
#include "train/model_setup.h"
#include "train/predict.h"
#include "train/progress.h"
#include "train/trainer.h"
#include "train/train_run.h"
#include "engine/atomic_file.h"
#include "engine/nn/layers.h"
#include "engine/optim/optimizer.h"
#include "engine/rng.h"
#include "engine/serialize.h"
#include "models/convnext.h"
#include "models/vit.h"
#include "tests/test_support.h"
#include "tests/trainer_config.h"

using namespace duet;
using namespace duet::app;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return duet::testing::fresh_temp_dir("test_trainer_" + name); }

// A tiny run: small_cnn of width 4 on 8x8 synthetic images, 4 steps per epoch.
TrainConfig tiny_config() { return duet::testing::tiny_train_config(); }

RunEnv env_for(Backend b) {
  RunEnv e;
  e.device = Device::cpu();
  e.backend = b;
  return e;
}

struct TinyRun {
  std::vector<double> losses;  // per step
  std::vector<EpochMetrics> epochs;
  std::string output;
};

// What run_training does, with the model injectable and the per-step losses recorded.
TinyRun train(TrainConfig c, Backend b, std::shared_ptr<nn::Module> model = nullptr) {
  BackendGuard backend(DeviceType::cpu, b);
  const RunEnv env = env_for(b);
  manual_seed(c.seed);
  TrainData data = make_train_data(c.data, c.seed);
  c.model.classes = static_cast<int64_t>(data.class_names.size());
  if (!model) model = build_model(c.model, c.model.classes, data.image_size);
  std::ostringstream out;
  TinyRun r;
  Trainer t(c, env, std::move(data), model, out);
  t.add_callback(std::make_shared<StepHook>([&](const StepRecord& s) { r.losses.push_back(s.loss); }));
  r.epochs = t.fit().epochs;
  r.output = out.str();
  return r;
}

class TrainerOnBackend : public ::testing::TestWithParam<Backend> {
protected:
  void SetUp() override { prev_ = default_backend(DeviceType::cpu); }
  void TearDown() override { set_default_backend(DeviceType::cpu, prev_); }
  Backend prev_ = Backend::reference;
};

std::string backend_param_name(const ::testing::TestParamInfo<Backend>& i) { return backend_name(i.param); }

}  // namespace

// ---- learning-rate schedules ---------------------------------------------------------------------

TEST(LrSchedule, OneCycleMatchesPyTorch) {
  // torch.optim.lr_scheduler.OneCycleLR(max_lr=0.1, total_steps=100, cycle_momentum=False)
  LrSchedule s({.kind = "onecycle", .base_lr = 0.1, .total_steps = 100});
  EXPECT_NEAR(s.lr_at(0), 0.0040000000000000036, 1e-15);
  EXPECT_NEAR(s.lr_at(1), 0.004281378056590748, 1e-15);
  EXPECT_NEAR(s.lr_at(10), 0.029516394846410082, 1e-15);
  EXPECT_NEAR(s.lr_at(29), 0.1, 1e-15);
  EXPECT_NEAR(s.lr_at(30), 0.09994965352845243, 1e-15);
  EXPECT_NEAR(s.lr_at(50), 0.0793893450575732, 1e-15);
  EXPECT_NEAR(s.lr_at(99), 4e-07, 1e-18);
  EXPECT_NEAR(s.lr_at(500), 4e-07, 1e-18);  // past the end: the last value
}

TEST(LrSchedule, CosineMatchesPyTorch) {
  // torch.optim.lr_scheduler.CosineAnnealingLR(lr=0.1, T_max=50, eta_min=0.001)
  LrSchedule s({.kind = "cosine", .base_lr = 0.1, .total_steps = 50, .min_lr = 0.001});
  EXPECT_NEAR(s.lr_at(0), 0.1, 1e-15);
  EXPECT_NEAR(s.lr_at(1), 0.09990232305719944, 1e-15);
  EXPECT_NEAR(s.lr_at(25), 0.0505, 1e-15);
  EXPECT_NEAR(s.lr_at(49), 0.0010976769428005578, 1e-15);
}

TEST(LrSchedule, StepWarmupAndMilestones) {
  LrSchedule step({.kind = "step", .base_lr = 1.0, .total_steps = 100, .step_size = 10, .gamma = 0.5});
  EXPECT_DOUBLE_EQ(step.lr_at(0), 1.0);
  EXPECT_DOUBLE_EQ(step.lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(step.lr_at(10), 0.5);
  EXPECT_DOUBLE_EQ(step.lr_at(35), 0.125);
  LrSchedule ms({.kind = "step", .base_lr = 1.0, .total_steps = 100, .milestones = {30, 60}, .gamma = 0.1});
  EXPECT_DOUBLE_EQ(ms.lr_at(29), 1.0);
  EXPECT_NEAR(ms.lr_at(30), 0.1, 1e-15);
  EXPECT_NEAR(ms.lr_at(60), 0.01, 1e-15);
  // Linear warm-up over 10 steps from 0, then cosine over the remaining 90 (to 0).
  LrSchedule wc({.kind = "cosine", .base_lr = 0.2, .total_steps = 100, .warmup_steps = 10});
  EXPECT_DOUBLE_EQ(wc.lr_at(0), 0.0);
  EXPECT_NEAR(wc.lr_at(5), 0.1, 1e-15);
  EXPECT_NEAR(wc.lr_at(10), 0.2, 1e-15);
  EXPECT_NEAR(wc.lr_at(55), 0.1, 1e-15);
  LrSchedule constant({.kind = "constant", .base_lr = 0.3, .total_steps = 10});
  EXPECT_DOUBLE_EQ(constant.lr_at(7), 0.3);
}

TEST(LrSchedule, BadConfigurationsNameTheField) {
  try {
    LrSchedule s({.kind = "exponential", .base_lr = 0.1});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'exponential'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("onecycle"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LrSchedule({.kind = "step", .base_lr = 0.1, .total_steps = 10}), Error);  // no step size
  EXPECT_THROW(LrSchedule({.kind = "onecycle", .base_lr = 0.1, .total_steps = 1}), Error);
  EXPECT_THROW(LrSchedule({.kind = "constant", .base_lr = -1}), Error);
}

TEST(LrSchedule, EpochSettingsBecomeSteps) {
  OptimConfig o;
  o.schedule = "step";
  o.lr = 0.4;
  o.warmup_epochs = 0.5;
  o.milestone_epochs = {2, 3};
  const LrScheduleConfig c = make_schedule_config(o, 4, 10);
  EXPECT_EQ(c.total_steps, 40);
  EXPECT_EQ(c.warmup_steps, 5);
  const LrSchedule s(c);
  EXPECT_NEAR(s.lr_at(19), 0.4, 1e-15);
  EXPECT_NEAR(s.lr_at(20), 0.04, 1e-15);  // the milestone at epoch 2 is absolute, after the warm-up
  EXPECT_NEAR(s.lr_at(30), 0.004, 1e-15);
}

// ---- reproducibility and resume --------------------------------------------------------------------

TEST_P(TrainerOnBackend, SameSeedSameLossCurve) {
  const TinyRun a = train(tiny_config(), GetParam());
  const TinyRun b = train(tiny_config(), GetParam());
  ASSERT_EQ(a.losses.size(), 8u);
  EXPECT_EQ(a.losses, b.losses);  // bit for bit
  TrainConfig other = tiny_config();
  other.seed = 8;
  EXPECT_NE(train(other, GetParam()).losses, a.losses);
}

TEST_P(TrainerOnBackend, ResumeEqualsUninterruptedTraining) {
  const fs::path dir = temp_dir("resume");
  // SGD + onecycle on a CNN; AdamW + warm-up + cosine on a narrow ViT with dropout, whose masks
  // come from the default generator (so its restored offset matters).
  for (const std::string optimizer : {"sgd", "adamw"}) {
    SCOPED_TRACE(optimizer);
    TrainConfig c = tiny_config();
    c.optim.optimizer = optimizer;
    if (optimizer == "adamw") {
      c.model = {.name = "vit_tiny_p4", .width_mult = 0.1, .dropout = 0.2};
      c.optim.nesterov = false;
      c.optim.lr = 0.01;
      c.optim.schedule = "cosine";
      c.optim.warmup_epochs = 0.5;
    }
    const TinyRun straight = train(c, GetParam());
    ASSERT_EQ(straight.losses.size(), 8u);

    // Interrupted after one epoch (the schedule still planned for two), then resumed.
    TrainConfig first = c;
    first.checkpoint = (dir / (optimizer + ".safetensors")).string();
    first.stop_after_epochs = 1;
    const TinyRun a = train(first, GetParam());
    ASSERT_EQ(a.losses.size(), 4u);
    TrainConfig second = c;
    second.resume = first.checkpoint;
    const TinyRun b = train(second, GetParam());
    ASSERT_EQ(b.losses.size(), 4u) << b.output;
    std::vector<double> joined = a.losses;
    joined.insert(joined.end(), b.losses.begin(), b.losses.end());
    EXPECT_EQ(joined, straight.losses);  // bit for bit
    ASSERT_EQ(b.epochs.size(), 1u);
    EXPECT_EQ(b.epochs[0].test_accuracy, straight.epochs[1].test_accuracy);
    EXPECT_EQ(b.epochs[0].test_loss, straight.epochs[1].test_loss);
    EXPECT_NE(b.output.find("resumed from"), std::string::npos) << b.output;
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Backends, TrainerOnBackend, ::testing::ValuesIn(duet::testing::cpu_backends()),
                         backend_param_name);

// The loop tells its callbacks, in order: each epoch's begin, every step, the end of its steps,
// then its metrics (after the epoch's checkpoint); the trainer's own display and log come first.
TEST(Trainer, CallbacksSeeEveryEpochAndStepInOrder) {
  struct Recorder final : TrainCallback {
    std::vector<std::string> calls;
    std::vector<EpochMetrics> metrics;
    std::string checkpoint;
    void on_epoch_begin(int64_t epoch, int64_t batches) override {
      calls.push_back(fmt::format("begin {} of {}", epoch, batches));
    }
    void on_step(const StepRecord& s, const EpochProgress& p) override {
      calls.push_back(fmt::format("step {} ({}/{})", s.step, p.batches_done, p.batches));
    }
    void on_epoch_steps_end() override { calls.push_back("steps end"); }
    void on_epoch_end(const EpochMetrics& m) override {
      calls.push_back(fmt::format("end {}{}", m.epoch, fs::exists(checkpoint) ? " after its checkpoint" : ""));
      metrics.push_back(m);
    }
  };
  const fs::path dir = temp_dir("callbacks");
  TrainConfig c = tiny_config();
  c.checkpoint = (dir / "ck.safetensors").string();
  c.log = (dir / "log.jsonl").string();
  const TrainData data = make_train_data(c.data, c.seed);
  c.model.classes = static_cast<int64_t>(data.class_names.size());
  manual_seed(c.seed);
  std::ostringstream out;
  Trainer t(c, env_for(Backend::reference), data, build_model(c.model, c.model.classes, data.image_size), out);
  auto rec = std::make_shared<Recorder>();
  rec->checkpoint = c.checkpoint;
  t.add_callback(rec);
  const TrainResult r = t.fit();
  const std::vector<std::string> expected = {
      "begin 0 of 4", "step 0 (1/4)", "step 1 (2/4)", "step 2 (3/4)", "step 3 (4/4)", "steps end",
      "end 1 after its checkpoint",
      "begin 1 of 4", "step 4 (1/4)", "step 5 (2/4)", "step 6 (3/4)", "step 7 (4/4)", "steps end",
      "end 2 after its checkpoint"};
  EXPECT_EQ(rec->calls, expected);
  ASSERT_EQ(rec->metrics.size(), r.epochs.size());
  for (size_t i = 0; i < r.epochs.size(); ++i) EXPECT_EQ(rec->metrics[i].to_json(), r.epochs[i].to_json());
  EXPECT_NE(out.str().find("epoch 2/2  loss"), std::string::npos) << out.str();  // the trainer's display came too
  std::ifstream log(c.log);
  std::string line;
  int lines = 0;
  while (std::getline(log, line)) ++lines;
  EXPECT_EQ(lines, 2);  // and --log's
  fs::remove_all(dir);
}

// --init-from with a Hugging Face DeiTForImageClassificationWithTeacher file into a distilled DeiT
// with another class count: the names are mapped, the backbone loads, and both heads (the class
// token's and the distillation token's) start new and are all that trains with --freeze-backbone.
TEST(TransferLearning, DistilledDeiTFromHuggingFaceGetsBothHeadsNew) {
  const std::string path = std::string(DUET_SOURCE_DIR) + "/tests/golden/fixtures/hf_deit_distilled.safetensors";
  models::ViTConfig v;
  v.image_size = 16, v.patch_size = 4, v.num_layers = 2, v.num_heads = 2, v.hidden_dim = 32, v.mlp_dim = 64;
  v.num_classes = 4;  // the file's heads have 10
  v.distilled = true;
  auto model = std::make_shared<models::VisionTransformer>(v);
  std::ostringstream out;
  init_from(*model, path, /*freeze=*/true, out);
  EXPECT_NE(out.str().find("Hugging Face transformers' ViT/DeiT names mapped"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("new classifier head 'head_dist', 'heads.head'"), std::string::npos) << out.str();
  for (const auto& [name, p] : model->named_parameters())
    EXPECT_EQ(p.requires_grad(), name.starts_with("heads.head.") || name.starts_with("head_dist.")) << name;
  Tensor file_proj;
  for (const auto& [name, t] : read_safetensors(path).tensors)
    if (name == "deit.embeddings.patch_embeddings.projection.weight") file_proj = t;
  ASSERT_TRUE(file_proj.defined());
  EXPECT_EQ(model->conv_proj->weight.to_vector<float>(), file_proj.to_vector<float>());
}

// --init-from with Hugging Face ConvNeXt files (tests/golden/make_hf_fixtures.py): into a duet
// ConvNeXt of the file's version, stages and classes every tensor loads (a V1 without layer scale
// gets scales of 1) and the logits are transformers' up to the head norm's eps (duet's 1e-6 against
// transformers' 1e-12: about 3e-6 here, see test_model_goldens' HuggingFace tests); a file of the
// other version, or for another family, is refused with the models it fits.
TEST(TransferLearning, ConvNeXtFromHuggingFaceReproducesTransformersLogits) {
  const std::string dir = std::string(DUET_SOURCE_DIR) + "/tests/golden/fixtures/";
  auto make = [](int version) {
    models::ConvNeXtConfig c;
    c.version = version;
    c.stages = {{8, 2}, {12, 1}, {16, 1}};
    c.stochastic_depth_prob = 0;
    c.num_classes = 10;
    return std::make_shared<models::ConvNeXt>(c);
  };
  for (const auto& [name, version, count] :
       {std::tuple{"hf_convnext", 1, 52}, std::tuple{"hf_convnext_no_layer_scale", 1, 52},
        std::tuple{"hf_convnextv2", 2, 56}}) {
    auto model = make(version);
    std::ostringstream out;
    init_from(*model, dir + name + ".safetensors", /*freeze=*/false, out);
    EXPECT_NE(out.str().find(version == 1 ? "ConvNeXt names mapped" : "ConvNeXt V2 names mapped"), std::string::npos)
        << out.str();
    EXPECT_NE(out.str().find(fmt::format(": {} tensors loaded\n", count)), std::string::npos) << out.str();
    Tensor input, logits;
    for (const auto& [k, v] : read_safetensors(dir + name + ".check.safetensors").tensors)
      (k == "input" ? input : logits) = v;
    model->eval();
    NoGradGuard no_grad;
    const std::vector<float> got = (*model)(input).to_vector<float>(), want = logits.to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(got[i]) - want[i]));
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
    }
    EXPECT_LE(diff / scale, 2e-5) << name;
  }
  std::ostringstream out;
  EXPECT_ERROR_HAS(init_from(*make(2), dir + "hf_convnext.safetensors", false, out),
                   "holds a Hugging Face ConvNeXt (transformers' ConvNextForImageClassification)", "convnext_tiny",
                   "not into this ConvNeXt V2");
  EXPECT_ERROR_HAS(init_from(*make(1), dir + "hf_convnextv2.safetensors", false, out),
                   "ConvNextV2ForImageClassification", "convnextv2_nano", "not into this ConvNeXt V1");
  models::ViTConfig v;
  v.image_size = 16, v.patch_size = 4, v.num_layers = 2, v.num_heads = 2, v.hidden_dim = 32, v.mlp_dim = 64;
  auto vit = std::make_shared<models::VisionTransformer>(v);
  EXPECT_ERROR_HAS(init_from(*vit, dir + "hf_convnext.safetensors", false, out), "not into this VisionTransformer");
}

// Checkpoints store the config through the structs' JSON definitions: every stored field comes
// back, the optimizer's defaults are stored resolved, an unset augmentation field stays unset, and
// a config of an older checkpoint without some keys reads them as the defaults.
TEST(TrainConfigJson, StoredFieldsRoundTripAndMissingKeysReadAsDefaults) {
  TrainConfig c;
  c.model = {.name = "resnet18_cifar", .classes = 10, .width_mult = 0.5, .dropout = 0.2};
  c.data.dataset = "cifar10";
  c.data.path = "some/where";
  c.data.flip = false;
  c.optim.optimizer = "adamw";
  c.optim.schedule = "step";
  c.optim.milestone_epochs = {2, 4};
  c.epochs = 7;
  c.batch = 32;
  c.seed = 12345678901234ULL;
  c.amp = "bf16";
  c.checkpoint = "not/stored.safetensors";
  const nlohmann::json j = stored_config(c);
  EXPECT_EQ(j["optim"]["lr"], 2e-3);            // adamw's default, resolved
  EXPECT_EQ(j["optim"]["weight_decay"], 0.01);  // likewise
  EXPECT_FALSE(j.contains("checkpoint"));
  const TrainConfig back = j.get<TrainConfig>();
  EXPECT_EQ(nlohmann::json(back.model), nlohmann::json(c.model));
  EXPECT_EQ(back.data.dataset, "cifar10");
  EXPECT_EQ(back.data.path, "some/where");
  EXPECT_EQ(back.data.flip, std::optional<bool>(false));
  EXPECT_FALSE(back.data.crop_padding.has_value());
  EXPECT_EQ(back.optim.optimizer, "adamw");
  EXPECT_EQ(back.optim.lr, std::optional<double>(2e-3));
  EXPECT_EQ(back.optim.milestone_epochs, (std::vector<double>{2, 4}));
  EXPECT_EQ(back.epochs, 7);
  EXPECT_EQ(back.batch, 32);
  EXPECT_EQ(back.seed, 12345678901234ULL);
  EXPECT_EQ(back.amp, "bf16");
  EXPECT_EQ(back.checkpoint, "");
  EXPECT_EQ(stored_config(back), j);

  const TrainConfig old = nlohmann::json::parse(R"({"model": {"name": "small_cnn"}, "epochs": 2})").get<TrainConfig>();
  const TrainConfig defaults;
  EXPECT_EQ(old.model.name, "small_cnn");
  EXPECT_EQ(old.model.classes, defaults.model.classes);
  EXPECT_EQ(old.epochs, 2);
  EXPECT_EQ(old.batch, defaults.batch);
  EXPECT_EQ(old.optim.optimizer, defaults.optim.optimizer);
  EXPECT_FALSE(old.optim.lr.has_value());
  EXPECT_EQ(old.data.dataset, defaults.data.dataset);
  EXPECT_THROW(nlohmann::json::parse(R"({"epochs": "three"})").get<TrainConfig>(), nlohmann::json::exception);
}

TEST(Trainer, ResumeRefusesADifferentRun) {
  const fs::path dir = temp_dir("mismatch");
  TrainConfig c = tiny_config();
  c.epochs = 1;
  c.checkpoint = (dir / "ck.safetensors").string();
  train(c, Backend::reference);
  TrainConfig other = tiny_config();
  other.batch = 16;
  other.resume = c.checkpoint;
  try {
    train(other, Backend::reference);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch size 32"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Trainer, LogHasOneJsonObjectPerEpoch) {
  const fs::path dir = temp_dir("log");
  TrainConfig c = tiny_config();
  c.log = (dir / "run.jsonl").string();
  const TinyRun r = train(c, Backend::reference);
  std::ifstream f(c.log);
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    EXPECT_EQ(j["epoch"], n + 1);
    for (const char* k : {"train_loss", "train_acc", "test_loss", "test_acc", "images_per_s", "epoch_seconds",
                          "train_seconds", "peak_memory_bytes", "lr"})
      EXPECT_TRUE(j.contains(k)) << k;
    EXPECT_GT(j["peak_memory_bytes"].get<int64_t>(), 0);
    ++n;
  }
  EXPECT_EQ(n, 2);
  fs::remove_all(dir);
}

// ---- checkpoints ---------------------------------------------------------------------------------

TEST(Checkpoint, RoundTripsStateAndConfig) {
  const fs::path dir = temp_dir("roundtrip");
  auto model = build_model({.name = "small_cnn", .width_mult = 0.25}, 3, 8);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  CheckpointState s;
  s.epoch = 3;
  s.step = 12;
  s.generator_seed = 0xfedcba9876543210ull;  // above 2^63: must survive as text
  s.generator_offset = 123456789012345ull;
  s.config = {{"model", {{"name", "small_cnn"}}}};
  s.metrics = {{"test_acc", 0.5}};
  const std::string path = (dir / "ck.safetensors").string();
  save_checkpoint(path, *model, &opt, s);
  const Checkpoint c = read_checkpoint(path);
  EXPECT_EQ(c.state.epoch, 3);
  EXPECT_EQ(c.state.step, 12);
  EXPECT_EQ(c.state.generator_seed, 0xfedcba9876543210ull);
  EXPECT_EQ(c.state.generator_offset, 123456789012345ull);
  EXPECT_EQ(c.state.config["model"]["name"], "small_cnn");
  EXPECT_EQ(c.model.size(), state_dict(*model).size());
  // A bare weights file is not a checkpoint, and the error says what to do with it.
  save_state_dict((dir / "weights.safetensors").string(), *model);
  try {
    read_checkpoint((dir / "weights.safetensors").string());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--init-from"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// Weights of a ViT trained at 32 px (8x8 patches of 4) start a 16 px run (4x4): the position
// embedding is resized, everything else loads as is, and the head is new for 3 classes.
TEST(Checkpoint, InitFromViTAtAnotherImageSize) {
  const fs::path dir = temp_dir("vit_resize");
  auto src = build_model({.name = "vit_tiny_p4", .width_mult = 1.0}, 10, 32);
  save_state_dict((dir / "vit32.safetensors").string(), *src);
  auto dst = build_model({.name = "vit_tiny_p4", .width_mult = 1.0}, 3, 16);
  std::ostringstream out;
  init_from(*dst, (dir / "vit32.safetensors").string(), false, out);
  EXPECT_NE(out.str().find("encoder.pos_embedding: [1, 65, 192] resized to [1, 17, 192]"), std::string::npos)
      << out.str();
  Tensor pos_src, pos_dst;
  for (const auto& [n, t] : src->named_parameters())
    if (n == "encoder.pos_embedding") pos_src = t;
  for (const auto& [n, t] : dst->named_parameters())
    if (n == "encoder.pos_embedding") pos_dst = t;
  ASSERT_EQ(pos_dst.shape(), (Shape{1, 17, 192}));
  // The class token's embedding is carried over unchanged.
  EXPECT_EQ(pos_dst.slice(1, 0, 1).to_vector<float>(), pos_src.slice(1, 0, 1).to_vector<float>());
  fs::remove_all(dir);
}

namespace {
// Whether process `pid` holds open a file without a name in `dir` (an O_TMPFILE write in progress:
// /proc shows such a file as "<dir>/#<inode> (deleted)").
bool writes_nameless_file(pid_t pid, const fs::path& dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    const std::string target = fs::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind(dir.string() + "/#", 0) == 0 && target.find("(deleted)") != std::string::npos) return true;
  }
  return false;
}

size_t temporaries_in(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().filename().string().rfind(".ck.safetensors.tmp-", 0) == 0;
  return n;
}
}  // namespace

// A checkpoint write killed at a random moment, with a nameless temporary file (O_TMPFILE, the
// default where the file system has it) and with a named one: the checkpoint is always a whole old
// or a whole new one; a killed nameless write leaves no file at all.
class KillMidWrite : public ::testing::TestWithParam<bool> {};

TEST_P(KillMidWrite, LeavesAWholeCheckpoint) {
  const bool anonymous = GetParam();
  const bool before = set_anonymous_temporaries(anonymous);
  const fs::path dir = temp_dir("kill");
  const std::string path = (dir / "ck.safetensors").string();
  auto small = build_model({.name = "small_cnn", .width_mult = 0.25}, 3, 8);
  CheckpointState old_state;
  old_state.epoch = 1;
  save_checkpoint(path, *small, nullptr, old_state);

  // A model big enough that writing it takes a while, so the kill lands mid-write.
  auto big = build_model({.name = "small_cnn", .width_mult = 16}, 3, 8);
  CheckpointState new_state;
  new_state.epoch = 2;
  int caught_mid_write = 0, caught_and_left_nothing = 0;
  for (int attempt = 0; attempt < 3; ++attempt) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      // Only plain file writes here: the forked child must not start OpenMP teams.
      for (;;) save_checkpoint(path, *big, nullptr, new_state);
    }
    // Wait until a write is under way (up to 10 s: a loaded machine may start the child late, and
    // fixed sleeps of 20-80 ms failed once in a ctest -j2 run), then let it write on for a different
    // time in each attempt.
    const auto writing = [&] { return anonymous ? writes_nameless_file(child, dir) : temporaries_in(dir) > 0; };
    for (int waited_ms = 0; waited_ms < 10000 && !writing(); ++waited_ms) ::usleep(1000);
    ::usleep(static_cast<useconds_t>(5000 * attempt));
    const bool mid_write = writing();
    ::kill(child, SIGKILL);
    int status = 0;
    ::waitpid(child, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status));
    caught_mid_write += mid_write;
    caught_and_left_nothing += mid_write && temporaries_in(dir) == 0;
    // Whatever the moment of the kill, the checkpoint is a whole old or a whole new one.
    const Checkpoint c = read_checkpoint(path);
    EXPECT_TRUE(c.state.epoch == 1 || c.state.epoch == 2) << c.state.epoch;
    const size_t expected = state_dict(c.state.epoch == 1 ? *small : *big).size();
    EXPECT_EQ(c.model.size(), expected);
  }
  EXPECT_GT(caught_mid_write, 0) << "the kill never caught a write in progress";
  // A nameless file is freed with the killed process (only a kill in the microseconds between
  // linkat and rename could leave a name, which the next write removes).
  if (anonymous) {
    EXPECT_GT(caught_and_left_nothing, 0) << "a killed nameless write left a temporary file";
  }
  set_anonymous_temporaries(before);
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Checkpoint, KillMidWrite, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "NamelessTemporary" : "NamedTemporary"; });

// ---- a non-finite loss ---------------------------------------------------------------------------

namespace {
// The wrapped model's output turns to NaN from the `after`-th call on.
class Poisoned : public nn::Module {
public:
  Poisoned(std::shared_ptr<nn::Module> inner, int after) : after_(after) { inner_ = register_module("inner", inner); }
  Tensor forward(const Tensor& x) override {
    Tensor y = (*inner_)(x);
    return is_training() && ++calls_ > after_ ? y * std::numeric_limits<double>::quiet_NaN() : y;
  }

private:
  std::shared_ptr<nn::Module> inner_;
  int after_, calls_ = 0;
};
}  // namespace

TEST(Trainer, NanLossStopsNamingTheStepAndTheLastCheckpoint) {
  const fs::path dir = temp_dir("nan");
  TrainConfig c = tiny_config();
  c.epochs = 3;
  c.checkpoint = (dir / "ck.safetensors").string();
  auto inner = build_model(c.model, 4, 8);
  auto model = std::make_shared<Poisoned>(inner, 6);  // steps 0..5 fine, step 6 (epoch 2) is NaN
  try {
    train(c, Backend::reference, model);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("loss is nan at step 6 (epoch 2, batch 3 of 4"), std::string::npos) << m;
    EXPECT_NE(m.find("last good checkpoint is '" + c.checkpoint + "' (after epoch 1)"), std::string::npos) << m;
  }
  // The checkpoint holds finite weights of epoch 1.
  const Checkpoint ck = read_checkpoint(c.checkpoint);
  EXPECT_EQ(ck.state.epoch, 1);
  for (const auto& [name, t] : ck.model) {
    if (t.dtype() != DType::f32) continue;
    for (float v : t.to_vector<float>()) ASSERT_TRUE(std::isfinite(v)) << name;
  }

  // Without a checkpoint the message says so.
  TrainConfig bare = tiny_config();
  try {
    train(bare, Backend::reference, std::make_shared<Poisoned>(build_model(c.model, 4, 8), 1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("at step 1 "), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("no checkpoint was written"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

// ---- predict ---------------------------------------------------------------------------------------

TEST(Predict, TopKOnFixedLogits) {
  const auto p = top_k({1.0f, 3.0f, 2.0f, 3.0f}, 3, {"a", "b", "c", "d"});
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[0].name, "b");  // a tie keeps the lower index first
  EXPECT_EQ(p[1].name, "d");
  EXPECT_EQ(p[2].name, "c");
  const double z = std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(p[0].probability, std::exp(3.0) / z, 1e-12);
  EXPECT_NEAR(p[2].probability, std::exp(2.0) / z, 1e-12);
  // Huge logits do not overflow; k is clamped to the classes.
  const auto q = top_k({1000.0f, 0.0f}, 5, {});
  ASSERT_EQ(q.size(), 2u);
  EXPECT_NEAR(q[0].probability, 1.0, 1e-12);
  EXPECT_EQ(q[1].name, "class1");
}

namespace {
// A w x h PNG of one colour with a little seeded noise.
void write_png(const fs::path& path, int w, int h, int r, int g, int b, uint64_t seed = 0) {
  std::vector<uint8_t> px(static_cast<size_t>(w * h * 3));
  for (size_t i = 0; i < px.size(); ++i) {
    const int base = i % 3 == 0 ? r : i % 3 == 1 ? g : b;
    const int noise = seed ? static_cast<int>(uniform01(seed, i) * 40.0) - 20 : 0;
    px[i] = static_cast<uint8_t>(std::clamp(base + noise, 0, 255));
  }
  ASSERT_NE(stbi_write_png(path.c_str(), w, h, 3, px.data(), w * 3), 0) << path;
}
}  // namespace

TEST(Predict, ImagePipelineResizesCropsAndNormalises) {
  const fs::path dir = temp_dir("pipeline");
  write_png(dir / "red.png", 40, 30, 255, 0, 51);
  const nlohmann::json t{{"resize_shorter", 10}, {"center_crop", 8}, {"mean", {0.5, 0.5, 0.5}}, {"std", {0.5, 0.25, 0.2}}};
  for (MemoryFormat f : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    const Tensor x = load_image_batch({(dir / "red.png").string()}, pipeline_from_json(t), f);
    EXPECT_EQ(x.shape(), (Shape{1, 3, 8, 8}));
    EXPECT_TRUE(x.is_contiguous(f));
    const std::vector<float> v = x.contiguous().to_vector<float>();  // NCHW
    EXPECT_NEAR(v[0], (1.0 - 0.5) / 0.5, 1e-5);          // red plane
    EXPECT_NEAR(v[64 + 10], (0.0 - 0.5) / 0.25, 1e-5);   // green plane
    EXPECT_NEAR(v[128 + 63], (0.2 - 0.5) / 0.2, 1e-5);   // blue plane
  }
  try {
    pipeline_from_json(nullptr);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("synthetic"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "broken.png") << "not a png";
  EXPECT_THROW(load_image_batch({(dir / "broken.png").string()}, pipeline_from_json(t), MemoryFormat::contiguous), Error);
  fs::remove_all(dir);
}

TEST(Predict, TrainOnAnImageFolderThenPredictWithTheCheckpoint) {
  // Reds and blues: learnable in a few steps, through the folder loader, checkpoint and predict.
  const fs::path dir = temp_dir("folder");
  for (const std::string split : {"train", "test"})
    for (int k = 0; k < (split == "train" ? 24 : 8); ++k) {
      fs::create_directories(dir / split / "blue");
      fs::create_directories(dir / split / "red");
      write_png(dir / split / "red" / fmt::format("{}.png", k), 20 + k % 5, 18, 220, 40, 40, 11 + k);
      write_png(dir / split / "blue" / fmt::format("{}.png", k), 18, 20 + k % 3, 40, 40, 220, 101 + k);
    }
  TrainConfig c;
  c.model.name = "small_cnn";
  c.model.width_mult = 0.25;
  c.data.dataset = "folder";
  c.data.path = dir.string();
  c.data.image_size = 12;
  c.data.workers = 2;
  c.epochs = 3;
  c.batch = 8;
  c.optim.lr = 0.05;
  c.checkpoint = (dir / "colours.safetensors").string();
  GlobalOptions g;
  g.backend = "reference";
  std::ostringstream out;
  const Backend prev = default_backend(DeviceType::cpu);
  const TrainResult r = run_training(c, g, out);
  set_default_backend(DeviceType::cpu, prev);
  ASSERT_EQ(r.epochs.size(), 3u) << out.str();
  EXPECT_GE(r.epochs.back().test_accuracy, 0.9) << out.str();

  const TrainedModel t = load_trained_model(c.checkpoint);
  EXPECT_EQ(t.class_names, (std::vector<std::string>{"blue", "red"}));
  EXPECT_EQ(t.image_size, 12);
  write_png(dir / "query.png", 33, 25, 230, 30, 30, 5);
  const datasets::Pipeline p = pipeline_from_json(t.raw_config["eval_transform"]);
  NoGradGuard no_grad;
  const Tensor logits = (*t.model)(load_image_batch({(dir / "query.png").string()}, p, MemoryFormat::contiguous));
  const auto top = top_k(logits.to_vector<float>(), 2, t.class_names);
  EXPECT_EQ(top[0].name, "red");
  EXPECT_GT(top[0].probability, 0.5);
  fs::remove_all(dir);
}

// ---- setup errors -------------------------------------------------------------------------------------

TEST(TrainSetup, UnknownModelListsTheKnownOnes) {
  try {
    build_model({.name = "resnet9000"}, 10, 32);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("unknown model 'resnet9000'"), std::string::npos) << m;
    EXPECT_NE(m.find("resnet18"), std::string::npos) << m;
    EXPECT_NE(m.find("small_cnn"), std::string::npos) << m;
  }
}

TEST(TrainSetup, MissingDatasetPathIsNamed) {
  DataOptions o;
  o.dataset = "cifar10";
  o.path = "/nonexistent/cifar";
  try {
    make_train_data(o, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'/nonexistent/cifar' does not exist"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("data_batch_1.bin"), std::string::npos) << e.what();
  }
  o.path.clear();
  EXPECT_THROW(make_train_data(o, 0), Error);  // --data missing altogether
  const fs::path dir = temp_dir("nosplit");
  o.dataset = "folder";
  o.path = dir.string();
  try {
    make_train_data(o, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no 'train' subfolder"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

TEST(Progress, BarText) {
  EXPECT_EQ(Progress::bar_text(0, 10, 10), "[>         ] 0/10");
  EXPECT_EQ(Progress::bar_text(5, 10, 10), "[=====>    ] 5/10");
  EXPECT_EQ(Progress::bar_text(10, 10, 10), "[==========] 10/10");
}
