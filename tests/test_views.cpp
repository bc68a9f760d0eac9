// Where users look at runs: TensorBoard event files (the record framing, CRC32C, histograms, the
// writer), and the bad input around them: an output folder that is missing or cannot be written
// gives a duet::Error before anything runs. TensorBoard's own reader checks the files themselves
// (tests/tensorboard_check.py).
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <nlohmann/json.hpp>
#include "reports/event_file.h"
#include "tests/cli_support.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::CliResult;
using duet::testing::contains;
using duet::testing::duet_cli;
namespace fs = std::filesystem;

namespace {

struct Scratch {
  fs::path path;
  Scratch() {
    path = fs::temp_directory_path() / ("duet-views-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}()));
    fs::create_directories(path);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : fs::recursive_directory_iterator(path)) out.push_back(e.path().filename().string());
    return out;
  }
};

std::string slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

uint64_t le(const std::string& s, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(s[at + static_cast<size_t>(i)]);
  return v;
}

// The records of an event file, each checked against its two masked CRCs.
std::vector<std::string> read_records(const std::string& file) {
  const std::string s = slurp(file);
  std::vector<std::string> out;
  size_t at = 0;
  while (at < s.size()) {
    EXPECT_LE(at + 12, s.size());
    const uint64_t n = le(s, at, 8);
    EXPECT_EQ(le(s, at + 8, 4), profiler::masked_crc32c(s.substr(at, 8))) << "length CRC of record " << out.size();
    const std::string data = s.substr(at + 12, n);
    EXPECT_EQ(le(s, at + 12 + n, 4), profiler::masked_crc32c(data)) << "data CRC of record " << out.size();
    out.push_back(data);
    at += 16 + n;
  }
  return out;
}

}  // namespace

// ---- TensorBoard event files ---------------------------------------------------------------------

TEST(EventFile, Crc32cIsCastagnolisOnKnownVectors) {
  EXPECT_EQ(profiler::crc32c(""), 0u);
  EXPECT_EQ(profiler::crc32c("123456789"), 0xe3069283u);
  // RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of ones, and 0..31.
  EXPECT_EQ(profiler::crc32c(std::string(32, '\0')), 0x8a9136aau);
  EXPECT_EQ(profiler::crc32c(std::string(32, '\xff')), 0x62a8ab43u);
  std::string inc;
  for (int i = 0; i < 32; ++i) inc.push_back(static_cast<char>(i));
  EXPECT_EQ(profiler::crc32c(inc), 0x46dd794eu);
  // Masked: rotated right by 15 bits, plus 0xa282ead8.
  const uint32_t c = 0xe3069283u;
  EXPECT_EQ(profiler::masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

TEST(EventFile, RecordIsLengthCrcDataCrc) {
  const std::string rec = profiler::frame_record("abc");
  ASSERT_EQ(rec.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(le(rec, 0, 8), 3u);
  EXPECT_EQ(le(rec, 8, 4), profiler::masked_crc32c(rec.substr(0, 8)));
  EXPECT_EQ(rec.substr(12, 3), "abc");
  EXPECT_EQ(le(rec, 15, 4), profiler::masked_crc32c("abc"));
}

TEST(EventFile, HistogramCountsEveryFiniteValueOnce) {
  const std::vector<float> v{-1.0f, 0.0f, 0.5f, 2.0f, 2.0f, std::nanf(""), INFINITY};
  const profiler::Histogram h = profiler::make_histogram(v, 4);
  EXPECT_EQ(h.num, 5);
  EXPECT_EQ(h.non_finite, 2);
  EXPECT_EQ(h.min, -1.0);
  EXPECT_EQ(h.max, 2.0);
  EXPECT_DOUBLE_EQ(h.sum, 3.5);
  EXPECT_DOUBLE_EQ(h.sum_squares, 1 + 0.25 + 4 + 4);
  ASSERT_EQ(h.limits.size(), 4u);
  EXPECT_EQ(h.limits.back(), 2.0);
  // Buckets [-1, -0.25], (-0.25, 0.5], (0.5, 1.25], (1.25, 2]: 0.5 falls in the second.
  EXPECT_EQ(h.counts, (std::vector<double>{1, 2, 0, 2}));
  const profiler::Histogram one = profiler::make_histogram(std::vector<float>(7, 0.25f));
  EXPECT_EQ(one.counts, std::vector<double>{7});
  EXPECT_EQ(one.limits, std::vector<double>{0.25});
  EXPECT_EQ(profiler::make_histogram(std::vector<float>{}).num, 0);
}

TEST(EventFile, WriterMakesTheFolderAndFramesEveryRecord) {
  Scratch dir;
  std::string path;
  {
    profiler::EventFileWriter w(dir / "runs/exp1");
    path = w.path();
    w.scalar("loss", 1, 0.5, "the loss");
    w.histogram("w", 1, profiler::make_histogram(std::vector<float>{1, 2, 3}));
    w.text("notes", 1, "# hello");
    w.flush();
  }
  EXPECT_EQ(fs::path(path).parent_path(), fs::path(dir / "runs/exp1"));
  EXPECT_EQ(fs::path(path).filename().string().rfind("events.out.tfevents.", 0), 0u) << path;
  const std::vector<std::string> recs = read_records(path);
  ASSERT_EQ(recs.size(), 4u);
  EXPECT_NE(recs[0].find("brain.Event:2"), std::string::npos);
  EXPECT_NE(recs[1].find("loss"), std::string::npos);
  EXPECT_NE(recs[3].find("# hello"), std::string::npos);
}

TEST(EventFile, UnwritableFolderIsAnError) {
  EXPECT_ERROR_HAS(profiler::EventFileWriter("/proc/duet-tb"), "TensorBoard folder '/proc/duet-tb'");
}

TEST(TensorBoardCli, BadFoldersFailBeforeTraining) {
  Scratch dir;
  const std::vector<std::string> train{"train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = train;
    a.insert(a.end(), extra.begin(), extra.end());
    return duet_cli(a);
  };
  const CliResult proc = with({"--tensorboard", "/proc/duet-tb/run1"});
  EXPECT_EQ(proc.status, 1);
  EXPECT_TRUE(contains(proc.err, "--tensorboard '/proc/duet-tb/run1': cannot create a file in the folder '/proc'")) << proc.err;
  EXPECT_EQ(proc.out, "") << "training started before the folder was checked";

  std::ofstream(dir / "a-file") << "x";
  const CliResult file = with({"--tensorboard", dir / "a-file"});
  EXPECT_EQ(file.status, 1);
  EXPECT_TRUE(contains(file.err, "is a file; expected a folder")) << file.err;
  EXPECT_EQ(file.out, "");

  const CliResult no_dir = with({"--tensorboard-histograms", "5"});
  EXPECT_EQ(no_dir.status, 1);
  EXPECT_TRUE(contains(no_dir.err, "--tensorboard-histograms needs --tensorboard DIR")) << no_dir.err;

  const CliResult prof = duet_cli({"profile", "--model", "mlp", "--tensorboard", "/proc/duet-tb"});
  EXPECT_EQ(prof.status, 1);
  EXPECT_TRUE(contains(prof.err, "--tensorboard '/proc/duet-tb': cannot create a file in the folder '/proc'")) << prof.err;
  const CliResult sweep = duet_cli({"profile", "--model", "mlp", "--batch", "4,8", "--tensorboard", dir / "tb"});
  EXPECT_EQ(sweep.status, 1);
  EXPECT_TRUE(contains(sweep.err, "--tensorboard is for one batch size")) << sweep.err;
  EXPECT_FALSE(fs::exists(dir / "tb"));
}

// A relative path whose folders are missing: they are made in the working folder (they once made
// the start-up check fail, "the folder 'runs' does not exist").
TEST(TensorBoardCli, RelativeMissingFoldersAreMade) {
  Scratch dir;
  const fs::path back = fs::current_path();
  fs::current_path(dir.path);
  const CliResult r = duet_cli({"--threads", "1", "train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1",
                                "--train-size", "32", "--test-size", "32", "--batch", "32", "--tensorboard", "runs/exp1",
                                "--profile", "reports/run.json"});
  fs::current_path(back);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_directory(dir / "runs/exp1"));
  EXPECT_TRUE(fs::exists(dir / "reports/run.json"));
}

TEST(TensorBoardCli, TrainingWritesStepAndEpochEvents) {
  Scratch dir;
  const CliResult r = duet_cli({"--threads", "1", "train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "2",
                                "--train-size", "64", "--test-size", "32", "--batch", "32", "--tensorboard",
                                dir / "tb", "--tensorboard-histograms", "1"});
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir / "tb")) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  const std::vector<std::string> recs = read_records(files[0].string());
  int steps = 0, epochs = 0, histograms = 0;
  for (const std::string& rec : recs) {
    steps += contains(rec, "step/loss");
    epochs += contains(rec, "epoch/test_acc");
    histograms += contains(rec, "weights/");
  }
  EXPECT_EQ(steps, 4);  // 2 epochs of 2 steps
  EXPECT_EQ(epochs, 2);
  // Every step (--tensorboard-histograms 1), each parameter once per step: an mlp has 3 layers of weight and bias.
  EXPECT_EQ(histograms, 4 * 6);
}
