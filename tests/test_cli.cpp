// The `duet` command line run in-process (cli/cli.h): errors a user can act on, exit statuses,
// and the small commands (models, data, selftest, eval/predict on a freshly trained checkpoint).
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "cli/cli.h"
#include <nlohmann/json.hpp>
#include "reports/sweep.h"
#include "tests/cli_support.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::CliResult;
using duet::testing::contains;
using duet::testing::duet_cli;
namespace fs = std::filesystem;

namespace {
}  // namespace

TEST(Cli, UnknownModelListsTheKnownOnes) {
  const CliResult r = duet_cli({"train", "--model", "resnet9000", "--epochs", "1"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.err, "duet: error: unknown model 'resnet9000': known models are")) << r.err;
  EXPECT_TRUE(contains(r.err, "resnet18_cifar")) << r.err;
}

TEST(Cli, MissingDatasetPathIsNamed) {
  const CliResult r = duet_cli({"train", "--dataset", "cifar10", "--data", "/no/such/cifar"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.err, "dataset path '/no/such/cifar' does not exist")) << r.err;
  const CliResult no_path = duet_cli({"train", "--dataset", "folder"});
  EXPECT_EQ(no_path.status, 1);
  EXPECT_TRUE(contains(no_path.err, "--dataset folder needs --data PATH")) << no_path.err;
}

TEST(Cli, BadOptionValuesAreParseErrors) {
  const CliResult r = duet_cli({"train", "--optimizer", "rmsprop"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.err, "rmsprop")) << r.err;
  EXPECT_NE(duet_cli({"train", "--epochs", "0"}).status, 0);
  EXPECT_NE(duet_cli({"frobnicate"}).status, 0);
  const CliResult none = duet_cli({});
  EXPECT_NE(none.status, 0);
}

// An output that cannot be written stops the command before any work: the error names the option
// and the path, and no epoch has run (nothing printed on stdout, where the epoch lines go).
TEST(Cli, UnwritableOutputsFailBeforeTraining) {
  const std::string missing = (std::filesystem::temp_directory_path() / "duet-no-such-folder-7f3a" / "ck.safetensors").string();
  const CliResult r = duet_cli({"train", "--dataset", "synthetic", "--epochs", "1", "--checkpoint", missing});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.err, "--checkpoint '" + missing + "': the folder")) << r.err;
  EXPECT_TRUE(contains(r.err, "does not exist")) << r.err;
  EXPECT_EQ(r.out, "") << "training started before the output was checked";

  const std::string folder = std::filesystem::temp_directory_path().string();
  const CliResult dir = duet_cli({"train", "--dataset", "synthetic", "--epochs", "1", "--log", folder});
  EXPECT_EQ(dir.status, 1);
  EXPECT_TRUE(contains(dir.err, "--log '" + folder + "' is a folder")) << dir.err;

  const CliResult proc = duet_cli({"train", "--dataset", "synthetic", "--epochs", "1", "--profile", "/proc/duet.json"});
  EXPECT_EQ(proc.status, 1);
  EXPECT_TRUE(contains(proc.err, "--profile '/proc/duet.json': cannot create a file in the folder '/proc'")) << proc.err;

  // profile creates missing folders for its report, so the probe goes to the nearest existing one.
  const CliResult prof = duet_cli({"profile", "--model", "mlp", "--out", "/proc/duet-reports/p.json"});
  EXPECT_EQ(prof.status, 1);
  EXPECT_TRUE(contains(prof.err, "--out '/proc/duet-reports/p.json': cannot create a file in the folder '/proc'"))
      << prof.err;
  // The probe's minute of measuring, a report's CSV and a comparison's JSON: checked first as well.
  for (const std::vector<std::string>& args : {std::vector<std::string>{"probe", "--out", "/proc/p/probe.json"},
                                               {"report", "no-such-report.json", "--csv", "/proc/p/t.csv"},
                                               {"compare", "a.json", "b.json", "--json", "/proc/p/c.json"}}) {
    const CliResult o = duet_cli(args);
    EXPECT_EQ(o.status, 1) << args[0];
    EXPECT_TRUE(contains(o.err, "cannot create a file in the folder '/proc'")) << args[0] << ": " << o.err;
  }
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(missing).parent_path())) << "a run created the missing folder";
}

// CLI11's range checks let NaN through; every floating-point option refuses NaN and infinities,
// and --lr-milestones is checked element by element.
TEST(Cli, NumericOptionsRefuseNanInfinityAndOutOfRange) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--lr-gamma", "nan"}, {"--stop-after-minutes", "nan"}, {"--warmup-epochs", "nan"},
        {"--lr", "inf"}, {"--momentum", "-inf"}, {"--label-smoothing", "1e999"}, {"--width-mult", "NaN"},
        {"--schedule", "step", "--lr-milestones", "-5"}, {"--schedule", "step", "--lr-milestones", "10,1e19"},
        {"--schedule", "step", "--lr-milestones", "10,nan"}}) {
    std::vector<std::string> full{"train", "--dataset", "synthetic", "--epochs", "1"};
    full.insert(full.end(), args.begin(), args.end());
    const CliResult r = duet_cli(full);
    EXPECT_NE(r.status, 0) << args[args.size() - 2] << " " << args.back() << " was accepted";
    EXPECT_EQ(r.out.find("epoch"), std::string::npos) << "training ran with " << args.back();
    EXPECT_TRUE(contains(r.err, args[args.size() - 2])) << r.err;
  }
}

TEST(Cli, HelpHasExamples) {
  const CliResult r = duet_cli({"--help"});
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(contains(r.out, "duet train --model small_cnn --dataset synthetic --profile")) << r.out;
  for (const char* cmd : {"train", "eval", "predict", "models", "data", "selftest", "profile", "probe", "report", "compare"})
    EXPECT_TRUE(contains(r.out, cmd)) << cmd;
  const CliResult t = duet_cli({"train", "--help"});
  EXPECT_EQ(t.status, 0);
  EXPECT_TRUE(contains(t.out, "--resume")) << t.out;
  EXPECT_TRUE(contains(t.out, "Examples:")) << t.out;
}

TEST(Cli, ModelsListsParametersAndFlops) {
  const CliResult r = duet_cli({"models", "small_cnn"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "small_cnn")) << r.out;
  EXPECT_TRUE(contains(r.out, "24346")) << r.out;  // parameters at width 16
  const CliResult none = duet_cli({"models", "nothing_like_this"});
  EXPECT_EQ(none.status, 1);
}

// `duet profile` with one batch size writes a per-op report of exactly the timed steps; with a
// list it writes a sweep with one point per size.
// duet profile --amp runs duet train's mixed-precision step: the convolutions in bf16 (casts in the
// profile), the run's configuration says so; fp16 with loss scaling; a bad value is refused.
TEST(Cli, ProfileWithMixedPrecision) {
  const std::vector<std::string> common{"profile", "--model", "small_cnn", "--width-mult", "0.25", "--image-size", "8",
                                        "--classes", "3",     "--steps",   "2",         "--warmup",     "1",    "--batch",
                                        "4"};
  for (const char* amp : {"bf16", "fp16"}) {
    std::vector<std::string> args = common;
    args.insert(args.end(), {"--amp", amp});
    const CliResult r = duet_cli(args);
    ASSERT_EQ(r.status, 0) << amp << ": " << r.err;
    EXPECT_TRUE(contains(r.out, "cast")) << amp << ": " << r.out;
    // A note, exactly where the backend hands the dtype's convolutions to the reference loops (f16
    // on the cpu backend; bf16 there on a CPU without AVX-512).
    const Backend b = backend_available(Backend::cpu) ? Backend::cpu : Backend::reference;
    const DType dt = std::string(amp) == "bf16" ? DType::bf16 : DType::f16;
    const bool slow = backend(b).support(OpId::conv2d, dt).coverage == Coverage::reference_loops;
    EXPECT_EQ(contains(r.out, "runs its convolutions and matrix products on the reference loops"), slow) << amp << ": " << r.out;
  }
  std::vector<std::string> bad = common;
  bad.insert(bad.end(), {"--amp", "fp8"});
  EXPECT_NE(duet_cli(bad).status, 0);
}

TEST(Cli, ProfileOneBatchAndSweep) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("duet_test_cli_profile_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string report = (dir / "r.json").string(), sweep = (dir / "s.json").string();
  const std::vector<std::string> common{"profile", "--model",   "small_cnn", "--width-mult", "0.25", "--image-size",
                                        "8",       "--classes", "3",         "--steps",      "3",    "--warmup", "1",
                                        "--backend", "reference"};
  std::vector<std::string> one = common;
  one.insert(one.end(), {"--batch", "4", "--out", report});
  const CliResult a = duet_cli(one);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_TRUE(contains(a.out, "conv2d.backward_weight")) << a.out;
  EXPECT_TRUE(contains(a.out, "small_cnn batch 4:")) << a.out;
  const nlohmann::json r = nlohmann::json::parse(std::ifstream(report));
  EXPECT_EQ(r["phases"]["steps"], 3);
  EXPECT_EQ(r["run_config"]["command"], "profile");
  EXPECT_EQ(r["run_config"]["batch"], 4);

  std::vector<std::string> two = common;
  two.insert(two.end(), {"--batch", "2,5", "--out", sweep});
  const CliResult b = duet_cli(two);
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_TRUE(contains(b.out, "throughput by batch size")) << b.out;
  const std::vector<profiler::SweepPoint> pts = profiler::sweep_points_from_json(nlohmann::json::parse(std::ifstream(sweep)));
  ASSERT_EQ(pts.size(), 2u);
  EXPECT_EQ(pts[0].batch, 2);
  EXPECT_EQ(pts[1].batch, 5);
  for (const auto& p : pts) {
    EXPECT_TRUE(p.error.empty()) << p.error;
    EXPECT_EQ(p.steps, 3);
    ASSERT_TRUE(p.images_per_s && p.peak_bytes);
    EXPECT_GT(*p.images_per_s, 0);
    EXPECT_GT(*p.peak_bytes, 0);
  }
  // A bigger batch holds more activations at its peak.
  EXPECT_GT(*pts[1].peak_bytes, *pts[0].peak_bytes);
  EXPECT_EQ(duet_cli({"profile", "--model", "small_cnn", "--batch", "4,0"}).status, 1);
  EXPECT_EQ(duet_cli({"profile", "--model", "no_such_model"}).status, 1);
  fs::remove_all(dir);
}

TEST(Cli, SelftestWithoutCudaSaysSo) {
#ifndef DUET_HAVE_CUDA
  const CliResult r = duet_cli({"selftest", "--device", "cuda"});
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(contains(r.out + r.err, "built without the CUDA backend")) << r.out << r.err;
#else
  if (device_count(DeviceType::cuda) == 0) {  // built with the backend, on a machine without a GPU
    const CliResult r = duet_cli({"selftest", "--device", "cuda"});
    EXPECT_EQ(r.status, 2);
    EXPECT_TRUE(contains(r.out, "no CUDA device")) << r.out << r.err;
  }
#endif
  EXPECT_EQ(duet_cli({"selftest", "--mode", "fast"}).status, 1);
}

// The op table on the CPU from the command line, in each of its modes.
TEST(Cli, SelftestRunsTheOpTableOnTheCpu) {
  CliResult r = duet_cli({"selftest", "--device", "cpu", "--filter", "matmul_2d"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "matmul_2d ") && contains(r.out, "cases passed on cpu")) << r.out;
  r = duet_cli({"selftest", "--device", "cpu", "--backend", "reference", "--mode", "gradient", "--filter", "conv_1x1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "gradient mode")) << r.out;
  r = duet_cli({"selftest", "--device", "cpu", "--mode", "perf", "--filter", "linear_bias"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_TRUE(contains(r.out, "GFLOP/s") && contains(r.out, "linear_bias ") && contains(r.out, "cases timed")) << r.out;
}

TEST(Cli, CudaDeviceWithoutTheBackendIsAnError) {
#ifndef DUET_HAVE_CUDA
  const CliResult r = duet_cli({"train", "--device", "cuda", "--epochs", "1"});
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(contains(r.err, "built without the CUDA backend")) << r.err;
#endif
  EXPECT_EQ(duet_cli({"train", "--device", "tpu"}).status, 1);
}

TEST(Cli, TrainEvalAndResumeOnSyntheticData) {
  const fs::path dir = fs::temp_directory_path() / fmt::format("duet_test_cli_{}", ::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string ck = (dir / "ck.safetensors").string(), log = (dir / "log.jsonl").string();
  const std::vector<std::string> common{"train",          "--dataset",         "synthetic", "--image-size", "8",
                                        "--train-size",   "64",                "--test-size", "32",         "--classes",
                                        "3",              "--width-mult",      "0.25",      "--batch",      "16",
                                        "--epochs",       "2",                 "--backend", "reference",    "--checkpoint",
                                        ck,               "--log",             log};
  std::vector<std::string> first = common;
  first.insert(first.end(), {"--stop-after-epochs", "1"});
  const CliResult a = duet_cli(first);
  ASSERT_EQ(a.status, 0) << a.err;
  EXPECT_TRUE(contains(a.out, "epoch 1/2")) << a.out;
  EXPECT_TRUE(contains(a.out, "--resume " + ck)) << a.out;
  std::vector<std::string> second = common;
  second.insert(second.end(), {"--resume", ck});
  const CliResult b = duet_cli(second);
  ASSERT_EQ(b.status, 0) << b.err;
  EXPECT_TRUE(contains(b.out, "resumed from")) << b.out;
  EXPECT_TRUE(contains(b.out, "epoch 2/2")) << b.out;
  EXPECT_FALSE(contains(b.out, "epoch 1/2")) << b.out;

  const CliResult e = duet_cli({"eval", ck, "--backend", "reference"});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "accuracy")) << e.out;
  EXPECT_TRUE(contains(e.out, "class2")) << e.out;  // the per-class table
  // Predicting needs image files and a model trained on images.
  const CliResult p = duet_cli({"predict", "-c", ck, log});
  EXPECT_EQ(p.status, 1);
  EXPECT_TRUE(contains(p.err, "synthetic")) << p.err;
  fs::remove_all(dir);
}

TEST(Cli, DataDescribesTheSharedDatasets) {
  DUET_REQUIRE_DATA_DIR();
  const CliResult c = duet_cli({"data", duet::testing::data_dir() + "/cifar10"});
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_TRUE(contains(c.out, "cifar10")) << c.out;
  EXPECT_TRUE(contains(c.out, "airplane")) << c.out;
  EXPECT_TRUE(contains(c.out, "10000")) << c.out;
  const CliResult f = duet_cli({"data", duet::testing::data_dir() + "/cats_dogs"});
  ASSERT_EQ(f.status, 0) << f.err;
  EXPECT_TRUE(contains(f.out, "cat")) << f.out;
  EXPECT_TRUE(contains(f.out, "500")) << f.out;
  EXPECT_TRUE(contains(f.out, "150")) << f.out;
  const CliResult bad = duet_cli({"data", "/no/such/folder"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_TRUE(contains(bad.err, "'/no/such/folder' does not exist")) << bad.err;
}
