// The studies (studies/*.py) in --quick mode: each script drives the built duet end to end (probe,
// train or profile, predict under mpirun) and writes its markdown tables and PNG figures. Needs the
// benchmark environment, .venv-bench/bin/python with matplotlib (and torch + torchvision for study 1's
// weight export; ./scripts/setup_bench.sh makes it), or $DUET_STUDY_PYTHON; without it each test
// skips, saying so. A quick run takes a few seconds: tiny images, widths and step counts.
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>
#include <gtest/gtest.h>
#include "tests/test_support.h"

namespace fs = std::filesystem;

namespace duet {
namespace {

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

std::string study_python() {
  if (const char* env = std::getenv("DUET_STUDY_PYTHON"); env && *env) return env;
  return std::string(DUET_SOURCE_DIR) + "/.venv-bench/bin/python";
}

// build/tests/test_studies -> build/duet: the binary the studies drive.
fs::path duet_binary() {
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return {};
  return self.parent_path().parent_path() / "duet";
}

struct Scratch {
  fs::path path;
  Scratch() {
    std::random_device rd;
    path = fs::temp_directory_path() / ("duet-study-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
    fs::create_directories(path);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs studies/<script> --quick into a scratch folder and checks what it wrote.
void run_quick(const std::string& script, bool needs_data, bool needs_torch, const std::vector<std::string>& pngs) {
  const std::string python = study_python();
  const std::string modules = needs_torch ? "import matplotlib, torch, torchvision" : "import matplotlib";
  if (std::system((python + " -c '" + modules + "' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << python << " with " << (needs_torch ? "matplotlib, torch and torchvision" : "matplotlib")
                 << " not found (./scripts/setup_bench.sh makes .venv-bench; or set DUET_STUDY_PYTHON): studies/"
                 << script << " not run";
  const fs::path duet = duet_binary();
  if (!fs::exists(duet)) GTEST_SKIP() << "no duet binary beside the tests (" << duet << "): studies/" << script << " not run";
  std::string data;
  if (needs_data) {
    DUET_REQUIRE_DATA_DIR();
    data = " --data " + testing::data_dir();
  }
  Scratch dir;
  const fs::path out = dir.path / "out", log = dir.path / "log.txt";
  const std::string cmd = python + " " + DUET_SOURCE_DIR + "/studies/" + script + " --quick --threads 1 --duet " +
                          duet.string() + data + " --out " + out.string() + " --work " + (dir.path / "work").string() +
                          " --no-page > " + log.string() + " 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string text = slurp(log);
  ASSERT_EQ(rc, 0) << cmd << "\n" << text;
  EXPECT_EQ(text.find("Traceback"), std::string::npos) << text;
  const std::string md = slurp(out / "results.md");
  EXPECT_NE(md.find("| ---"), std::string::npos) << "no table in results.md:\n" << md;
  EXPECT_NE(md.find("Commands run"), std::string::npos) << md;
  EXPECT_TRUE(fs::exists(out / "summary.json"));
  for (const std::string& png : pngs) {
    const std::string bytes = slurp(out / png);
    EXPECT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(0, 4), "\x89PNG") << png;
    EXPECT_NE(md.find("](" + png + ")"), std::string::npos) << png << " is not shown in results.md";
  }
}

TEST(Studies, TransferLearningQuick) {
  run_quick("transfer_learning.py", true, true, {"memory.png", "steps.png", "top_ops.png", "utilisation.png"});
}

TEST(Studies, BatchSweepQuick) { run_quick("batch_sweep.py", true, false, {"sweep.png", "phases.png"}); }

TEST(Studies, CnnVsTransformerQuick) {
  run_quick("cnn_vs_transformer.py", true, false, {"op_kinds.png", "duration_vs_batch.png"});
}

TEST(Studies, RooflineQuick) { run_quick("roofline.py", false, false, {"roofline.png"}); }

// A study refuses a missing duet binary with a message, not a traceback.
TEST(Studies, MissingBinaryIsAMessage) {
  const std::string python = study_python();
  if (std::system((python + " -c 'import matplotlib' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << python << " with matplotlib not found: studies/ not run";
  Scratch dir;
  const fs::path log = dir.path / "log.txt";
  const std::string cmd = python + " " + DUET_SOURCE_DIR + "/studies/roofline.py --quick --duet " +
                          (dir.path / "no-duet").string() + " --out " + (dir.path / "out").string() + " --work " +
                          (dir.path / "work").string() + " --no-page > " + log.string() + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  const std::string text = slurp(log);
  EXPECT_NE(text.find("no duet binary at"), std::string::npos) << text;
  EXPECT_EQ(text.find("Traceback"), std::string::npos) << text;
}

}  // namespace
}  // namespace duet
