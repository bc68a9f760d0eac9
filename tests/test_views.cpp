// Where users look at runs: TensorBoard event files (the record framing, CRC32C, histograms, the
// writer) and the HTML report, and the bad input around both: an output folder that is missing or
// cannot be written, a report of another format or a malformed one give a duet::Error before any
// file is written. TensorBoard's own reader and a real browser check the files themselves
// (tests/tensorboard_check.py, tests/html_report_check.py).
#include <unistd.h>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <nlohmann/json.hpp>
#include "reports/event_file.h"
#include "reports/html_report.h"
#include "reports/report.h"
#include "tests/cli_support.h"
#include "tests/test_support.h"

using namespace duet;
using duet::testing::CliResult;
using duet::testing::contains;
using duet::testing::duet_cli;
namespace fs = std::filesystem;

namespace {

using duet::testing::TempDir;

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

// A profile report of a short run, made once for the suite.
const std::string& report_path() {
  static TempDir dir("views");
  static const std::string path = dir / "run.json";
  if (!fs::exists(path)) {
    const CliResult r = duet_cli({"--threads", "1", "train", "--model", "mlp", "--dataset", "synthetic", "--epochs", "1",
                                  "--train-size", "64", "--test-size", "32", "--batch", "32", "--profile", path});
    EXPECT_EQ(r.status, 0) << r.err;
  }
  return path;
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
  TempDir dir("views");
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
  TempDir dir("views");
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
  TempDir dir("views");
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
  TempDir dir("views");
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

// ---- the HTML report -------------------------------------------------------------------------------

TEST(HtmlReport, PageIsSelfContainedAndCarriesTheReport) {
  TempDir dir("views");
  const CliResult r = duet_cli({"report", report_path(), "--html", dir / "run.html"});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string page = slurp(dir / "run.html");
  EXPECT_EQ(page.rfind("<!DOCTYPE html>", 0), 0u);
  for (const char* fetch : {"<script src", "<link", "@import", "url(", "fetch(", "XMLHttpRequest"})
    EXPECT_FALSE(contains(page, fetch)) << "the page loads something: " << fetch;
  const std::string open = "<script type=\"application/json\" id=\"duet-data\">";
  const size_t a = page.find(open), b = page.find("</script>", a);
  ASSERT_NE(a, std::string::npos);
  const nlohmann::json data = nlohmann::json::parse(page.substr(a + open.size(), b - a - open.size()));
  EXPECT_EQ(data["kind"], "report");
  const nlohmann::json report = profiler::load_report(report_path());
  EXPECT_EQ(data["report"]["op_table"].size(), report["op_table"].size());
  EXPECT_EQ(data["report"]["op_table"][0]["self_ns"], report["op_table"][0]["self_ns"]);
  EXPECT_FALSE(data["report"].contains("op_records"));  // the page keeps what it draws
}

TEST(HtmlReport, NamesCannotEndTheDataElement) {
  nlohmann::json report = profiler::load_report(report_path());
  report["run_config"]["model"] = "</script><script>alert(1)</script><!--";
  const std::string page = profiler::report_html(report, "evil.json");
  EXPECT_FALSE(contains(page, "</script><script>alert")) << "a name closed the data element";
  EXPECT_FALSE(contains(page, "<!--\"")) << "a name opened a comment";
  EXPECT_TRUE(contains(page, "\\u003c/script>\\u003cscript>alert(1)"));
  // Its title is escaped as HTML.
  EXPECT_TRUE(contains(page, "&lt;/script&gt;&lt;script&gt;alert(1)"));
}

// Bad input: a clear error, and the output file is not written (nor any temporary beside it).
TEST(HtmlReport, BadInputWritesNothing) {
  TempDir dir("views");
  const std::string good = report_path();
  nlohmann::json older = nlohmann::json::parse(slurp(good));
  older["schema"] = "duet.profile/0";
  std::ofstream(dir / "older.json") << older.dump();
  nlohmann::json unknown = {{"schema", "duet.compare/1"}, {"reports", nlohmann::json::array()}};
  std::ofstream(dir / "other.json") << unknown.dump();
  std::ofstream(dir / "noschema.json") << R"({"op_table": []})";
  const std::string text = slurp(good);
  std::ofstream(dir / "cut.json") << text.substr(0, text.size() / 2);
  nlohmann::json edited = nlohmann::json::parse(text);
  edited["memory"]["devices"][0]["current"] = "lots";
  std::ofstream(dir / "edited.json") << edited.dump();
  fs::create_directories(dir / "out");
  const std::string html = dir / "out/page.html";

  struct Case {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Case> cases = {
      {{"report", dir / "older.json", "--html", html}, "has schema 'duet.profile/0': this duet reads 'duet.profile/1'"},
      {{"report", dir / "other.json", "--html", html}, "has schema 'duet.compare/1'"},
      {{"report", dir / "noschema.json", "--html", html}, "noschema.json"},
      {{"report", dir / "cut.json", "--html", html}, "is not valid JSON"},
      {{"report", dir / "edited.json", "--html", html}, "\"memory\" section has a field missing or of the wrong type"},
      {{"report", dir / "missing.json", "--html", html}, "does not exist"},
      {{"report", good, good, "--html", html}, "--html are for one report"},
      {{"compare", good, dir / "cut.json", "--html", html}, "is not valid JSON"},
      {{"compare", good, dir / "older.json", "--html", html}, "has schema 'duet.profile/0'"},
      {{"report", good, "--html", dir / "no-such-folder/page.html"}, "the folder"},
      {{"report", good, "--html", "/proc/duet-page.html"}, "cannot create a file in the folder '/proc'"},
      {{"compare", good, good, "--html", "/proc/duet-cmp.html"}, "cannot create a file in the folder '/proc'"},
      {{"report", good, "--html", dir / "out"}, "is a folder; expected a file name"},
  };
  for (const Case& c : cases) {
    const CliResult r = duet_cli(c.args);
    EXPECT_EQ(r.status, 1) << c.args[1];
    EXPECT_TRUE(contains(r.err, "duet: error: ")) << r.err;
    EXPECT_TRUE(contains(r.err, c.error)) << r.err << "\n  lacks: " << c.error;
    EXPECT_TRUE(fs::is_empty(dir / "out")) << "a file was written for " << c.args[1];
  }
  EXPECT_FALSE(fs::exists(dir / "no-such-folder"));
  // The same reports are fine for the text report: only the HTML was asked of a good one.
  const CliResult ok = duet_cli({"compare", good, good, "--html", html});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_TRUE(fs::exists(html));
}
