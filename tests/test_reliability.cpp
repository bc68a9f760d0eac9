// Never lose a run (issue 14): outputs probed at start-up, numeric options that refuse NaN and
// out-of-range values, resume that checks every tensor and field, no checkpoint of non-finite
// weights, temporary-file debris removed, SIGINT/SIGTERM that stop with a checkpoint resuming
// exactly, and sizes bounded before allocation.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>
#include <stb/stb_image_write.h>
#include "train/checkpoint.h"
#include "cli/cli.h"
#include "train/interrupt.h"
#include "train/model_file.h"
#include "train/output_check.h"
#include "train/trainer.h"
#include "datasets/image_file.h"
#include "engine/optim/optimizer.h"
#include "reports/compare.h"
#include "reports/records.h"
#include "reports/report.h"
#include "engine/rng.h"
#include "engine/serialize.h"
#include "tests/cli_support.h"
#include "tests/test_support.h"
#include "tests/trainer_config.h"

using namespace duet;
using namespace duet::app;
using duet::testing::CliResult;
using duet::testing::contains;
using duet::testing::duet_cli;
namespace fs = std::filesystem;


namespace {

fs::path temp_dir(const std::string& name) { return duet::testing::fresh_temp_dir("test_reliability_" + name); }


// The tiny synthetic run of tests/trainer_config.h as command-line options.
std::vector<std::string> tiny_args() {
  return {"train", "--model", "small_cnn", "--width-mult", "0.25", "--dataset", "synthetic", "--image-size", "8",
          "--train-size", "120", "--test-size", "32", "--classes", "4", "--workers", "1", "--batch", "32",
          "--backend", "reference", "--seed", "7"};
}

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& more) {
  a.insert(a.end(), more.begin(), more.end());
  return a;
}

struct TinyRun {
  std::vector<double> losses;
  std::vector<EpochMetrics> epochs;
  TrainResult result;
  std::string output;
};

// What run_training does, with the per-step losses recorded and a hook after each step.
TinyRun train(TrainConfig c, const std::function<void(const StepRecord&, Trainer&)>& hook = nullptr) {
  BackendGuard backend(DeviceType::cpu, Backend::reference);
  RunEnv env;
  env.device = Device::cpu();
  env.backend = Backend::reference;
  manual_seed(c.seed);
  TrainData data = make_train_data(c.data, c.seed);
  c.model.classes = static_cast<int64_t>(data.class_names.size());
  auto model = build_model(c.model, c.model.classes, data.image_size);
  std::ostringstream out;
  TinyRun r;
  Trainer t(c, env, std::move(data), model, out);
  t.add_callback(std::make_shared<StepHook>([&](const StepRecord& s) {
    r.losses.push_back(s.loss);
    if (hook) hook(s, t);
  }));
  r.result = t.fit();
  r.epochs = r.result.epochs;
  r.output = out.str();
  return r;
}

TrainConfig tiny() { return duet::testing::tiny_train_config(); }

}  // namespace

// ---- outputs ---------------------------------------------------------------------------------------

TEST(Outputs, CheckpointInAMissingFolderFailsBeforeTheFirstStep) {
  const CliResult r = duet_cli(with(tiny_args(), {"--epochs", "1", "--checkpoint", "/no/such/folder/ck.safetensors"}));
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.err, "--checkpoint '/no/such/folder/ck.safetensors': the folder '/no/such/folder' does not "
                              "exist"))
      << r.err;
  EXPECT_FALSE(contains(r.out, "epoch 1/")) << r.out;  // no step was taken
  EXPECT_FALSE(contains(r.out, "model small_cnn")) << r.out;  // nor was the data made
}

TEST(Outputs, EveryOutputIsProbed) {
  const fs::path dir = temp_dir("outputs");
  std::ofstream(dir / "a_file") << "x";
  // A folder that exists but cannot take a new file (/proc), a path whose folder is a file, a
  // path that is a folder, for each output option.
  for (const std::string option : {"--checkpoint", "--log", "--profile", "--trace"}) {
    SCOPED_TRACE(option);
    std::vector<std::string> extra = option == "--trace" ? std::vector<std::string>{"--profile"} : std::vector<std::string>{};
    const CliResult proc = duet_cli(with(with(tiny_args(), extra), {option, "/proc/duet_probe.out"}));
    EXPECT_EQ(proc.status, 1);
    EXPECT_TRUE(contains(proc.err, option + " '/proc/duet_probe.out'")) << proc.err;
    EXPECT_FALSE(contains(proc.out, "epoch 1/")) << proc.out;
    const std::string under_file = (dir / "a_file" / "x.out").string();
    const CliResult f = duet_cli(with(with(tiny_args(), extra), {option, under_file}));
    EXPECT_EQ(f.status, 1);
    EXPECT_TRUE(contains(f.err, option + " '" + under_file + "'")) << f.err;
    const CliResult d = duet_cli(with(with(tiny_args(), extra), {option, dir.string()}));
    EXPECT_EQ(d.status, 1);
    EXPECT_TRUE(contains(d.err, "is a folder")) << d.err;
  }
  // The probe leaves nothing behind.
  size_t entries = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 1u);
  // Profile reports create their folders: a missing one under a writable folder is fine.
  EXPECT_NO_THROW(check_output_file("--profile", (dir / "new" / "deeper" / "p.json").string(),
                                    OutputKind::creates_folders));
  fs::remove_all(dir);
}

TEST(Outputs, NamesThatAreNotUtf8AreStoredNotFatal) {
  const fs::path dir = temp_dir("utf8");
  nlohmann::json config = {{"class_names", {"cat", std::string("caf\xe9")}}, {"data", {{"path", "/d/\xff\xfe"}}}};
  EXPECT_EQ(first_invalid_utf8(config), "class_names[1]");
  EXPECT_THROW((void)config.dump(), nlohmann::json::type_error);  // what used to escape as "internal error"
  auto model = build_model({.name = "small_cnn", .width_mult = 0.25}, 2, 8);
  CheckpointState s;
  s.config = config;
  const std::string path = (dir / "ck.safetensors").string();
  ASSERT_NO_THROW(save_checkpoint(path, *model, nullptr, s));
  const Checkpoint c = read_checkpoint(path);
  EXPECT_EQ(c.state.config["class_names"][1], "caf\xef\xbf\xbd");  // U+FFFD in place of the bad byte
  // A tensor name that is not UTF-8 cannot be stored: a clear error, not nlohmann's.
  EXPECT_ERROR_HAS(save_safetensors((dir / "w.safetensors").string(), {{"w\xff", Tensor::zeros({1})}}), "not valid UTF-8",
                   "w.safetensors");
  fs::remove_all(dir);
}

// ---- numeric options ------------------------------------------------------------------------------

TEST(Options, NanInfinitiesAndOutOfRangeAreRefusedNamingTheOption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--lr", "nan"},           {"--lr", "inf"},        {"--lr-gamma", "nan"},          {"--stop-after-minutes", "nan"},
      {"--warmup-epochs", "nan"}, {"--momentum", "-inf"}, {"--weight-decay", "NaN"},      {"--label-smoothing", "nan"},
      {"--min-lr", "inf"},       {"--pct-start", "nan"}, {"--div-factor", "nan"},        {"--final-div-factor", "inf"},
      {"--warmup-start", "nan"}, {"--lr-step-epochs", "nan"}, {"--width-mult", "nan"},  {"--dropout", "nan"},
      {"--scale-min", "nan"},    {"--lr", "1e999"},      {"--lr-milestones", "-5"},      {"--lr-milestones", "30,1e19"},
      {"--lr-milestones", "30,nan"}, {"--lr", "0.1x"}};
  for (const auto& [option, value] : cases) {
    SCOPED_TRACE(option + " " + value);
    const CliResult r = duet_cli(with(tiny_args(), {"--schedule", "step", option, value}));
    EXPECT_NE(r.status, 0);
    EXPECT_TRUE(contains(r.err, option)) << r.err;
    EXPECT_FALSE(contains(r.out, "epoch 1/")) << r.out;
  }
  // The schedule checks the same fields for callers that do not come through the command line.
  OptimConfig o;
  o.schedule = "step";
  o.milestone_epochs = {std::numeric_limits<double>::quiet_NaN()};
  EXPECT_ERROR_HAS(make_schedule_config(o, 3, 10), "--lr-milestones nan");
  o.milestone_epochs = {-5};
  EXPECT_ERROR_HAS(make_schedule_config(o, 3, 10), "--lr-milestones -5");
  o.milestone_epochs = {};
  o.warmup_epochs = std::numeric_limits<double>::infinity();
  EXPECT_ERROR_HAS(make_schedule_config(o, 3, 10), "--warmup-epochs inf");
  o.warmup_epochs = 0;
  o.gamma = std::numeric_limits<double>::quiet_NaN();
  EXPECT_ERROR_HAS(make_schedule_config(o, 3, 10), "--lr-gamma");
}

// ---- resume ---------------------------------------------------------------------------------------

namespace {
// A checkpoint of one epoch of the tiny run, edited by `edit`, then resumed.
void resume_edited(const fs::path& dir, const std::function<void(SafetensorsFile&)>& edit) {
  TrainConfig c = tiny();
  c.checkpoint = (dir / "ck.safetensors").string();
  c.stop_after_epochs = 1;
  train(c);
  SafetensorsFile f = read_safetensors(c.checkpoint);
  edit(f);
  const std::string edited = (dir / "edited.safetensors").string();
  save_safetensors(edited, f.tensors, f.metadata);
  TrainConfig r = tiny();
  r.resume = edited;
  train(r);
}
}  // namespace

TEST(Resume, EveryOptimizerTensorAndFieldIsChecked) {
  const fs::path dir = temp_dir("resume_checks");
  const auto drop = [](const std::string& name) {
    return [name](SafetensorsFile& f) {
      std::erase_if(f.tensors, [&](const auto& nt) { return nt.first == name; });
    };
  };
  EXPECT_ERROR_HAS(resume_edited(dir, drop("optimizer.state.0.momentum_buffer")), "lacks 1 optimizer state tensor",
                   "optimizer.state.0.momentum_buffer");
  EXPECT_ERROR_HAS(resume_edited(dir, drop("optimizer.steps")), "no optimizer tensor 'optimizer.steps'");
  EXPECT_ERROR_HAS(resume_edited(dir,
                                 [](SafetensorsFile& f) {
                                   f.tensors.emplace_back("optimizer.state.99999999999999999999.momentum_buffer",
                                                          Tensor::zeros({1}));
                                 }),
                   "99999999999999999999", "too large");
  const auto meta = [](const std::string& key, const std::string& value) {
    return [key, value](SafetensorsFile& f) { f.metadata[key] = value; };
  };
  EXPECT_ERROR_HAS(resume_edited(dir, meta("epoch", "9223372036854775808")), "'epoch' is 9223372036854775808",
                   "expected at most 9223372036854775807");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("step", "18446744073709551615")), "'step'");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("epoch", "5000000")), "at most 1000000");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("epoch", "-1")), "'epoch' is '-1'");  // stoull alone reads 2^64 - 1
  EXPECT_ERROR_HAS(resume_edited(dir, meta("step", " 4")), "'step' is ' 4'");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("config", "[1, 2]")), "'config' is array");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("metrics", "{\"train_seconds\": \"soon\"}")), "'metrics' is malformed");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("partial_epoch", "{\"batch\": 9}")), "'partial_epoch' is malformed");
  EXPECT_ERROR_HAS(resume_edited(dir, meta("partial_epoch", "{\"batch\": 9, \"loss_sum\": 1, \"seconds\": 1, "
                                                            "\"correct\": 1, \"seen\": 1, \"skipped_before\": 0}")),
                   "batch 9 of an epoch of 4");
  fs::remove_all(dir);
}

// eval and predict read the stored config into a TrainConfig: a field of the wrong type is named
// with the file, not an "internal error".
TEST(Resume, MalformedConfigOfATrainedModelIsNamed) {
  const fs::path dir = temp_dir("model_config");
  TrainConfig c = tiny();
  c.checkpoint = (dir / "ck.safetensors").string();
  c.stop_after_epochs = 1;
  train(c);
  SafetensorsFile f = read_safetensors(c.checkpoint);
  nlohmann::json config = nlohmann::json::parse(f.metadata["config"]);
  config["batch"] = "sixty-four";
  f.metadata["config"] = config.dump();
  const std::string edited = (dir / "edited.safetensors").string();
  save_safetensors(edited, f.tensors, f.metadata);
  EXPECT_ERROR_HAS(load_trained_model(edited), "edited.safetensors", "config is malformed");
  fs::remove_all(dir);
}

TEST(Resume, NoCheckpointOfNonFiniteWeights) {
  // The epoch's last update overflows the weights (a finite loss before it, so the per-step loss
  // check cannot see it): training stops there, the epoch's checkpoint is not written, and the
  // message names the checkpoint that is good.
  const fs::path dir = temp_dir("nan_weights");
  TrainConfig c = tiny();
  c.epochs = 3;
  c.checkpoint = (dir / "ck.safetensors").string();
  const auto poison_at = [](int64_t step) {
    return [step](const StepRecord& s, Trainer& t) {
      if (s.step != step) return;
      NoGradGuard no_grad;
      t.model().named_parameters()[0].second.fill_(std::numeric_limits<double>::quiet_NaN());
    };
  };
  EXPECT_ERROR_HAS(train(c, poison_at(7)), "holds nan after the update of step 7 (epoch 2, batch 4 of 4)",
                   "last good checkpoint is '" + c.checkpoint + "' (after epoch 1)");
  const Checkpoint ck = read_checkpoint(c.checkpoint);
  EXPECT_EQ(ck.state.epoch, 1);
  for (const auto& [name, t] : ck.model)
    if (t.dtype() == DType::f32) {
      for (float v : t.to_vector<float>()) ASSERT_TRUE(std::isfinite(v)) << name;
    }
  fs::remove_all(dir);
}

// ---- temporary files ------------------------------------------------------------------------------

TEST(Checkpoint, DebrisOfAKilledWriteIsRemovedByTheNextWrite) {
  const fs::path dir = temp_dir("debris");
  const std::string path = (dir / "ck.safetensors").string();
  for (const char* name : {".ck.safetensors.tmp-a1B2c3", ".ck.safetensors.tmp-ZZZZZZ"})
    std::ofstream(dir / name) << std::string(1000, 'x');
  // Not debris of this file: other files' temporaries and names that only look alike.
  for (const char* name : {".other.safetensors.tmp-a1B2c3", ".ck.safetensors.tmp-toolong1", "ck.safetensors.tmp-a1B2c3"})
    std::ofstream(dir / name) << "keep";
  auto model = build_model({.name = "small_cnn", .width_mult = 0.25}, 2, 8);
  save_checkpoint(path, *model, nullptr, CheckpointState{});
  std::set<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.insert(e.path().filename().string());
  EXPECT_EQ(left, (std::set<std::string>{"ck.safetensors", ".other.safetensors.tmp-a1B2c3",
                                         ".ck.safetensors.tmp-toolong1", "ck.safetensors.tmp-a1B2c3"}));
  EXPECT_NO_THROW(read_checkpoint(path));
  fs::remove_all(dir);
}

// ---- signals --------------------------------------------------------------------------------------

namespace {
// SIGINT raised after global step `at`: the trainer finishes that step and stops.
std::function<void(const StepRecord&, Trainer&)> interrupt_after(int64_t at, int sig = SIGINT) {
  return [at, sig](const StepRecord& s, Trainer&) {
    if (s.step == at) ::raise(sig);
  };
}
}  // namespace

TEST(Interrupt, MidEpochCheckpointResumesExactly) {
  const fs::path dir = temp_dir("sigint");
  for (const std::string optimizer : {"sgd", "adamw"}) {
    SCOPED_TRACE(optimizer);
    TrainConfig c = tiny();
    c.optim.optimizer = optimizer;
    if (optimizer == "adamw") {  // dropout masks come from the default generator
      c.model = {.name = "vit_tiny_p4", .width_mult = 0.1, .dropout = 0.2};
      c.optim.nesterov = false;
      c.optim.lr = 0.01;
      c.optim.schedule = "cosine";
    }
    const TinyRun straight = train(c);
    ASSERT_EQ(straight.losses.size(), 8u);

    TrainConfig first = c;
    first.checkpoint = (dir / (optimizer + ".safetensors")).string();
    TinyRun a;
    {
      const InterruptGuard guard;
      a = train(first, interrupt_after(5));  // epoch 2, batch 2 of 4
    }
    EXPECT_EQ(a.result.interrupted_by, SIGINT);
    ASSERT_EQ(a.losses.size(), 6u);
    EXPECT_EQ(a.epochs.size(), 1u);  // epoch 2 was not finished, so not evaluated
    EXPECT_TRUE(contains(a.output, "SIGINT: stopped after step 6 (epoch 2, batch 2 of 4)")) << a.output;
    EXPECT_TRUE(contains(a.output, "--resume " + first.checkpoint)) << a.output;
    const Checkpoint ck = read_checkpoint(first.checkpoint);
    EXPECT_EQ(ck.state.epoch, 1);
    EXPECT_EQ(ck.state.step, 6);
    EXPECT_EQ(ck.state.partial_epoch["batch"], 2);

    TrainConfig second = c;
    second.resume = first.checkpoint;
    const TinyRun b = train(second);
    EXPECT_TRUE(contains(b.output, "and 2 of 4 batches of epoch 2")) << b.output;
    std::vector<double> joined = a.losses;
    joined.insert(joined.end(), b.losses.begin(), b.losses.end());
    EXPECT_EQ(joined, straight.losses);  // bit for bit
    ASSERT_EQ(b.epochs.size(), 1u);
    EXPECT_EQ(b.epochs[0].train_loss, straight.epochs[1].train_loss);
    EXPECT_EQ(b.epochs[0].train_accuracy, straight.epochs[1].train_accuracy);
    EXPECT_EQ(b.epochs[0].test_loss, straight.epochs[1].test_loss);
    EXPECT_EQ(b.epochs[0].test_accuracy, straight.epochs[1].test_accuracy);
  }
  fs::remove_all(dir);
}

TEST(Interrupt, AtTheEndOfAnEpochTheEpochCheckpointIsKept) {
  const fs::path dir = temp_dir("sigterm");
  TrainConfig c = tiny();
  c.epochs = 3;
  c.checkpoint = (dir / "ck.safetensors").string();
  TinyRun a;
  {
    const InterruptGuard guard;
    a = train(c, interrupt_after(3, SIGTERM));  // the last step of epoch 1
  }
  EXPECT_EQ(a.result.interrupted_by, SIGTERM);
  EXPECT_EQ(a.epochs.size(), 1u);
  EXPECT_TRUE(contains(a.output, "SIGTERM: stopped after epoch 1 of 3")) << a.output;
  const Checkpoint ck = read_checkpoint(c.checkpoint);
  EXPECT_EQ(ck.state.epoch, 1);
  EXPECT_TRUE(ck.state.partial_epoch.is_null());
  fs::remove_all(dir);
}

TEST(Interrupt, ASecondSignalExitsAtOnce) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const InterruptGuard guard;
    ::raise(SIGINT);  // recorded
    if (interrupt_signal() != SIGINT) ::_exit(3);
    ::raise(SIGINT);  // exits with 128 + 2
    ::_exit(4);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 130);
}

TEST(Interrupt, CommandLineExitsWith143AndResumes) {
  const fs::path dir = temp_dir("cli_signal");
  const std::string ck = (dir / "ck.safetensors").string(), log = (dir / "run.jsonl").string();
  const std::vector<std::string> run = with(tiny_args(), {"--epochs", "100000", "--checkpoint", ck, "--log", log});
  // The signal is sent once training has written its first checkpoint: the handler is installed
  // by then (before it, SIGTERM's default action would end the test process).
  std::thread killer([ck] {
    for (int i = 0; i < 6000 && !fs::exists(ck); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ::kill(::getpid(), SIGTERM);
  });
  const CliResult r = duet_cli(run);
  killer.join();
  EXPECT_EQ(r.status, 143) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "SIGTERM: stopped after")) << r.out;
  EXPECT_TRUE(contains(r.out, "--resume " + ck)) << r.out;
  const Checkpoint c = read_checkpoint(ck);
  // The handler is gone after the run: the default action would end this test, so check it.
  struct sigaction now {};
  ::sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, SIG_DFL);
  const CliResult resumed = duet_cli(with(run, {"--resume", ck, "--stop-after-epochs", "1"}));
  EXPECT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_TRUE(contains(resumed.out, fmt::format("resumed from '{}': {} epochs ({} steps) done", ck, c.state.epoch,
                                                c.state.step)))
      << resumed.out;
  fs::remove_all(dir);
}

// ---- sizes ----------------------------------------------------------------------------------------

namespace {
void write_raw_safetensors(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream f(path, std::ios::binary);
  const uint64_t n = header.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << header << std::string(data_bytes, '\0');
}
}  // namespace

TEST(Sizes, SafetensorsShapeProductsCannotOverflow) {
  const fs::path dir = temp_dir("st_sizes");
  const std::string path = (dir / "big.safetensors").string();
  // [2^32, 2^32] U8 is 2^64 bytes, which wraps to 0 and used to pass as an empty tensor.
  write_raw_safetensors(path, R"({"w":{"dtype":"U8","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0);
  EXPECT_ERROR_HAS(read_safetensors(path), "'w'", "overflows a 64-bit size");
  // A zero size does not excuse an overflowing rest (the strides would overflow).
  write_raw_safetensors(path, R"({"w":{"dtype":"F32","shape":[0,9223372036854775807,4],"data_offsets":[0,0]}})", 0);
  EXPECT_ERROR_HAS(read_safetensors(path), "overflows");
  write_raw_safetensors(path, R"({"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,4]}})", 4);
  EXPECT_ERROR_HAS(read_safetensors(path), "overflows");
  fs::remove_all(dir);
}

TEST(Sizes, ImagesAreBoundedBeforeDecoding) {
  const fs::path dir = temp_dir("pixels");
  std::vector<uint8_t> px(40 * 30 * 3, 128);
  const std::string png = (dir / "small.png").string();
  ASSERT_NE(stbi_write_png(png.c_str(), 40, 30, 3, px.data(), 40 * 3), 0);
  EXPECT_EQ(datasets::decode_image_file(png).w, 40);
  EXPECT_ERROR_HAS(datasets::decode_image_file(png, 1000), "40 x 30 = 1200 pixels", "limit of 1000",
                   "--max-image-pixels");
  EXPECT_NE(datasets::check_image_file(png, 1000), "");
  // A small file declaring 16000 x 16000 (the IHDR's size patched, its CRC made right again, as
  // a crafted file would have it) is refused from its header.
  std::vector<uint8_t> bytes = datasets::read_file_bytes(png);
  ASSERT_EQ(std::memcmp(bytes.data() + 12, "IHDR", 4), 0);
  for (int k : {16, 20}) {
    const uint32_t v = 16000;
    bytes[k] = 0, bytes[k + 1] = 0, bytes[k + 2] = static_cast<uint8_t>(v >> 8), bytes[k + 3] = static_cast<uint8_t>(v);
  }
  const uLong crc = crc32(crc32(0, nullptr, 0), bytes.data() + 12, 4 + 13);  // over "IHDR" and its 13 bytes
  for (int i = 0; i < 4; ++i) bytes[29 + i] = static_cast<uint8_t>(crc >> (24 - 8 * i));
  EXPECT_ERROR_HAS(datasets::decode_image_bytes(bytes.data(), bytes.size(), "huge.png"), "16000 x 16000 = 256000000",
                   "huge.png");
  fs::remove_all(dir);
}

TEST(Sizes, OptimizerStateIndexBeyondInt64IsAClearError) {
  const Tensor w = Tensor::zeros({2}).set_requires_grad(true);
  optim::SGD opt({w}, {.lr = 0.1, .momentum = 0.9});
  EXPECT_ERROR_HAS(opt.load_state_tensors({{"state.99999999999999999999.momentum_buffer", Tensor::zeros({2})}}),
                   "too large");
  EXPECT_ERROR_HAS(opt.load_state_tensors({{"steps", Tensor::zeros({2})}}), "expected an integer scalar");
  EXPECT_ERROR_HAS(opt.load_state_tensors({{"steps", Tensor::scalar(-3, DType::i64)}}), "step count >= 0");
}

TEST(Outputs, ProfileCommandProbesItsOutputsBeforeTheSteps) {
  const CliResult r = duet_cli({"profile", "--model", "small_cnn", "--width-mult", "0.25", "--image-size", "8",
                                "--batch", "2", "--steps", "1", "--warmup", "0", "--backend", "reference", "--out",
                                "/proc/duet_probe.json"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.err, "--out '/proc/duet_probe.json'")) << r.err;
}

// ---- fuzzing findings -----------------------------------------------------------------------------

// Found by fuzz_image: a JPEG whose Huffman table declares more than 256 codes made Debian's
// stb_image 2.27 write past its tables (UBSan: index 257 out of bounds in stbi__build_huffman).
namespace {
// A regression JPEG with a Huffman table of more than 256 codes: refused by the structure check
// and by decoding, naming the file (`name`) and the limit.
void expect_huffman_table_refused(const std::string& file, const std::string& name) {
  const std::vector<uint8_t> bytes = datasets::read_file_bytes(std::string(DUET_SOURCE_DIR) + "/fuzz/regressions/" + file);
  const std::string problem = datasets::check_image_bytes(bytes.data(), bytes.size());
  EXPECT_NE(problem.find("corrupt JPEG: Huffman table at byte"), std::string::npos) << problem;
  EXPECT_ERROR_HAS(datasets::decode_image_bytes(bytes.data(), bytes.size(), name), name, "(at most 256)");
}
}  // namespace

TEST(FuzzFinding, JpegHuffmanTableOfMoreThan256CodesIsRefused) {
  expect_huffman_table_refused("image_dht_257_codes.jpg", "dht.jpg");
}

// Found by fuzz_image in the campaign of 2026-11-25 (same UBSan report as above): the Huffman
// table of more than 256 codes sat behind a DQT of length 2 followed by bytes that are no marker.
// stb_image skips such padding and read the table; check_jpeg took the junk for a marker and
// skipped the table by its bogus length.
TEST(FuzzFinding, JpegHuffmanTableBehindPaddingIsStillChecked) {
  expect_huffman_table_refused("image_dht_behind_padding.jpg", "pad.jpg");
}

// Found by fuzz_image in the campaign of 2026-11-25: corrupt entropy-coded data made stb_image
// 2.27's JPEG bit reader shift by 33 (UBSan: stbi__grow_buffer_unsafe), undefined behaviour. JPEGs
// are now decoded by libjpeg-turbo; this file must be a clear error or an image, never a crash.
namespace {
// A regression input that once made a decoder misbehave: now an image or a duet::Error naming it.
void expect_decoded_or_named(const std::string& file) {
  const std::vector<uint8_t> bytes = datasets::read_file_bytes(std::string(DUET_SOURCE_DIR) + "/fuzz/regressions/" + file);
  try {
    const datasets::Image img = datasets::decode_image_bytes(bytes.data(), bytes.size(), file);
    EXPECT_EQ(img.pixels.size(), static_cast<size_t>(img.h * img.w * img.c));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(FuzzFinding, JpegWithCorruptEntropyCodedDataIsDecodedSafely) {
  expect_decoded_or_named("image_jpeg_bit_reader_shift.jpg");
}

// Found by fuzz_image in the campaign of 2026-11-25: a PNG whose first IDAT chunk is empty made
// stb_image 2.27 memcpy to a null pointer (UBSan), undefined behaviour. PNGs are now decoded by
// libpng; this file must be a clear error or an image, never a crash.
TEST(FuzzFinding, PngWithAnEmptyFirstImageDataChunkIsDecodedSafely) {
  expect_decoded_or_named("image_png_empty_first_idat.png");
}

// Found by fuzz_report: a number beyond a double ("0.005584e88830205156") made nlohmann throw
// out_of_range, which load_report did not catch ("internal error", or terminate in a fuzzer).
TEST(FuzzFinding, ReportWithANumberBeyondADoubleIsAClearError) {
  const std::string path = std::string(DUET_SOURCE_DIR) + "/fuzz/regressions/report_number_overflow.json";
  EXPECT_ERROR_HAS(profiler::load_report(path), "report_number_overflow.json", "is not valid JSON", "number overflow");
  const fs::path dir = temp_dir("report_number");
  std::ofstream(dir / "r.json") << R"({"schema": "duet.profile/1", "x": 1e999})";
  EXPECT_ERROR_HAS(profiler::load_report((dir / "r.json").string()), "is not valid JSON");
  fs::remove_all(dir);
}

// Found by fuzz_report (UBSan) in the 25-minute campaign of 2026-11-25: an op record's "max_ns"
// of 719e109 went through nlohmann's get<int64_t>(), a plain cast of a float far beyond int64 and
// undefined behaviour. Integer fields of reports must be integers that fit.
TEST(FuzzFinding, ReportIntegerFieldHoldingAHugeFloatIsAClearError) {
  const std::string path = std::string(DUET_SOURCE_DIR) + "/fuzz/regressions/report_float_for_integer_field.json";
  EXPECT_ERROR_HAS(profiler::load_report(path), "'max_ns' is 7.19e+111", "fits in 64 bits");
  EXPECT_FALSE(profiler::is_int64(nlohmann::json(7.19e111)));
  EXPECT_FALSE(profiler::is_int64(nlohmann::json(uint64_t{1} << 63)));
  EXPECT_TRUE(profiler::is_int64(nlohmann::json(int64_t{-5})));
}

// Found by fuzz_report (ASan: heap-use-after-free): `compare` read phases["images_per_s"] through
// operator[] of a const json, undefined when the key is missing. This suite runs under ASan in CI.
TEST(FuzzFinding, CompareOfAReportWithoutImagesPerSecond) {
  const std::string path = std::string(DUET_SOURCE_DIR) + "/fuzz/regressions/report_phases_without_images_per_s.json";
  const nlohmann::json r = profiler::load_report(path);
  ASSERT_FALSE(r["phases"].contains("images_per_s"));
  const nlohmann::json cmp = profiler::compare({{"a", r}, {"b", r}});
  bool found = false;
  for (const auto& row : cmp["phases"])
    if (row["phase"] == "images/s") {
      found = true;
      EXPECT_TRUE(row["value"][0].is_null()) << row.dump();  // unknown, not a read of freed memory
    }
  EXPECT_TRUE(found) << cmp["phases"].dump();
  EXPECT_FALSE(profiler::format_compare(cmp).empty());
}
