// Helpers of the data-parallel tests that drive mpirun from outside (tests/test_distributed.cpp
// on one machine, tests/hosts/test_hosts.cpp across network namespaces): shell commands under a
// time limit, scratch folders removed at exit, and parameter comparisons.
#pragma once
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include "engine/serialize.h"

namespace duet::testing {

struct Proc {
  int rc = -1;
  std::string out;
  double seconds = 0;
};

// Runs a shell command (output and errors together) under `timeout`, so that a hang fails the
// test instead of blocking it. Open MPI refuses root without OMPI_ALLOW_RUN_AS_ROOT: set here, for
// the tests only (CI runs as root).
inline Proc sh(const std::string& cmd, int timeout_s = 120) {
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string full = fmt::format("timeout -k 5 {} sh -c '{}' 2>&1", timeout_s, cmd);
  Proc r;
  FILE* p = ::popen(full.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

// The folders temp_dir made, removed with their checkpoints and profiles when the test program
// exits (ctest runs each test in a process of its own), so that runs do not pile up in /tmp.
struct MadeDirs {
  std::vector<std::filesystem::path> paths;
  ~MadeDirs() {
    std::error_code ec;
    for (const auto& p : paths) std::filesystem::remove_all(p, ec);
  }
};

inline std::string temp_dir(const std::string& name) {
  static MadeDirs made;
  const std::filesystem::path d =
      std::filesystem::path(::testing::TempDir()) / fmt::format("duet_dist_{}_{}", name, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  made.paths.push_back(d);
  return d.string();
}

// Largest |a - b| over a tensor, relative to its largest |b|; the worst over the named tensors.
inline double max_relative_difference(const NamedTensors& a, const NamedTensors& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    const std::vector<double> x = a[i].second.to(DType::f64).to_vector<double>();
    const std::vector<double> y = b[i].second.to(DType::f64).to_vector<double>();
    EXPECT_EQ(x.size(), y.size()) << a[i].first;
    double diff = 0, scale = 0;
    for (size_t k = 0; k < std::min(x.size(), y.size()); ++k) {
      diff = std::max(diff, std::abs(x[k] - y[k]));
      scale = std::max(scale, std::abs(y[k]));
    }
    worst = std::max(worst, scale > 0 ? diff / scale : diff);
  }
  return worst;
}

// ||a - b|| / ||b|| over all the named tensors together (Euclidean norms).
inline double relative_l2_difference(const NamedTensors& a, const NamedTensors& b) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const std::vector<double> x = a[i].second.to(DType::f64).to_vector<double>();
    const std::vector<double> y = b[i].second.to(DType::f64).to_vector<double>();
    for (size_t k = 0; k < std::min(x.size(), y.size()); ++k) {
      diff += (x[k] - y[k]) * (x[k] - y[k]);
      norm += y[k] * y[k];
    }
  }
  return std::sqrt(diff / norm);
}

inline std::string read_text(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace duet::testing
