// Shared helpers for the test suites: the gradient checker, tensor comparison, backend lists
// and the shared data folder.
#pragma once
#include <unistd.h>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>
#include <gtest/gtest.h>
#include <fmt/format.h>
#include "engine/duet.h"
#include "engine/profiler/events.h"

namespace duet::testing {

// Central-difference gradient check in f64 (the reference backend is forced for the check).
// `f` maps the inputs to any tensor; the check differentiates sum(f(inputs) * R) for a fixed
// random R, so every output element matters. Inputs must be f64 leaves; those with
// requires_grad are checked. Returns "" on success, else a description of the worst mismatch.
std::string gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Tensor>& inputs,
                      double eps = 1e-6, double atol = 1e-6, double rtol = 1e-5);

// Max |a - b| / (atol + rtol * |b|) over elements; <= 1 means close (opcheck::closeness).
double closeness(const Tensor& a, const Tensor& b, double atol, double rtol);
::testing::AssertionResult all_close(const Tensor& a, const Tensor& b, double atol = 1e-5, double rtol = 1e-4);

// Random f64/f32 tensor in [lo, hi) with a fixed seed (opcheck::random_values: the op table's values).
Tensor random_tensor(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double lo = -1.0, double hi = 1.0);

// Backends present in this build (reference always).
std::vector<Backend> cpu_backends();

// "" when the cpu backend runs bf16 convolutions on its own (oneDNN) kernels, else why it does not
// (below AVX-512 oneDNN 2.6 has no bf16 kernels: they run on the reference loops, support() says).
std::string cpu_bf16_convolutions_not_native();

// The profiler's events of what run() did: the profiler cleared, on for run() only, and cleared
// again after the events are taken.
std::vector<OpEvent> profiled_events(const std::function<void()>& run);

// The shared data folder from DUET_DATA_DIR; "" when absent. Tests that need it call
// DUET_REQUIRE_DATA_DIR(), which skips visibly when absent (or fails when DUET_REQUIRE_DATA=1).
std::string data_dir();
// Runs stmt and expects a duet::Error whose message holds every one of the given strings.
#define EXPECT_ERROR_HAS(stmt, ...)                                                                       \
  do {                                                                                                    \
    try {                                                                                                 \
      stmt;                                                                                               \
      ADD_FAILURE() << "expected duet::Error from " #stmt;                                                \
    } catch (const ::duet::Error& e) {                                                                    \
      for (const std::string& part : std::vector<std::string>{__VA_ARGS__})                               \
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what() << "\n  lacks: " << part; \
    }                                                                                                     \
  } while (0)

#define DUET_REQUIRE_DATA_DIR()                                                                  \
  do {                                                                                           \
    if (::duet::testing::data_dir().empty()) {                                                   \
      if (std::getenv("DUET_REQUIRE_DATA")) FAIL() << "DUET_REQUIRE_DATA is set but no data dir"; \
      GTEST_SKIP() << "shared data folder not found (set DUET_DATA_DIR)";                      \
    }                                                                                            \
  } while (0)

// A test that needs a GPU or the CUDA backend: skips visibly without it, or fails when
// DUET_REQUIRE_CUDA=1 (set by scripts/gpu_check.sh), so that on a GPU machine a CUDA test that did
// not run cannot pass for one that did. `why` is streamed into the message.
#define DUET_SKIP_WITHOUT_CUDA(why)                                                   \
  do {                                                                                \
    if (std::getenv("DUET_REQUIRE_CUDA")) FAIL() << "DUET_REQUIRE_CUDA is set, but " << why; \
    GTEST_SKIP() << why;                                                              \
  } while (0)

// An empty folder "duet_<name>_<pid>" under the temporary directory (emptied if it was there),
// left after the test for a look at what it wrote.
inline std::filesystem::path fresh_temp_dir(const std::string& name) {
  const std::filesystem::path d = std::filesystem::temp_directory_path() / fmt::format("duet_{}_{}", name, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A folder of its own for one test's files (every instance another one), removed with the object.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& tag) {
    static std::atomic<int> made{0};
    path = fresh_temp_dir(fmt::format("{}_{}", tag, made++));
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string operator/(const std::string& name) const { return (path / name).string(); }
  // The names of everything under it, subfolders included.
  std::vector<std::string> files() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::recursive_directory_iterator(path)) out.push_back(e.path().filename().string());
    return out;
  }
};

}  // namespace duet::testing
