// `duet probe`: measures this machine's ceilings for the roofline, through the engine itself (the
// matmul front-end on the chosen backend, Tensor::copy_), per CPU thread count, and caches them
// per user (~/.cache/duet/probe-<hostname>-<cpu model hash>.json). Reports look the cache up
// for the same CPU (model and logical CPU count) and say "no probe" when there is none.
#pragma once
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "reports/roofline.h"

namespace duet::profiler {

struct ProbeOptions {
  std::string device = "cpu";  // "cpu", "cuda", "cuda:1"
  std::string backend;         // "" = the device's default backend; "reference" for plain loops
  int64_t gemm_size = 2048;    // square fp32 GEMM, n x n times n x n (and the same in bf16)
  int64_t copy_mib = 256;      // size of each of the two copy buffers
  std::vector<int> threads;    // CPU thread counts to measure; empty: 1 .. omp_get_max_threads()
  int repeats = 5;             // timed runs after one warm-up; the best is kept
};

struct ProbePoint {
  int threads = 0;  // 0 on a GPU
  double gemm_gflops = 0, copy_gbs = 0;
  double gemm_best_ns = 0, copy_best_ns = 0;
  // bf16 GEMM; 0 where the backend has no bf16 kernels for it (a CPU without AVX-512, a GPU
  // whose cuBLAS refuses bf16)
  double gemm_bf16_gflops = 0, gemm_bf16_best_ns = 0;
};

struct ProbeResult {
  nlohmann::json machine;  // machine_info() at probe time
  std::string device, backend, created;
  int64_t gemm_size = 0;
  int64_t copy_bytes = 0;  // per buffer
  int repeats = 0;
  std::vector<ProbePoint> points;
};

// Runs the measurements (seconds to a minute); the profiler records nothing meanwhile.
ProbeResult run_probe(const ProbeOptions& o);
std::string format_probe(const ProbeResult& r);

// The cache folder: $DUET_CACHE_DIR, else $XDG_CACHE_HOME/duet, else $HOME/.cache/duet.
std::string probe_cache_dir();
// probe-<hostname>-<8 hex digits of the CPU model's hash>.json in probe_cache_dir().
std::string default_probe_path(const nlohmann::json& machine);

// Adds (or replaces) the device's entry in the probe file at `path` (created when absent) and
// writes it atomically. File schema "duet.probe/1":
// {"schema", "machine", "devices": {"cpu": {"backend", "created", "gemm_size", "copy_bytes",
//   "repeats", "points": [{"threads", "gemm_gflops", "copy_gbs", "gemm_best_ns", "copy_best_ns",
//   "gemm_bf16_gflops", "gemm_bf16_best_ns"}]}}} (the bf16 pair is absent from older files: 0)
void save_probe(const ProbeResult& r, const std::string& path);
// Reads a probe file; throws duet::Error for a missing or malformed file or another schema.
nlohmann::json load_probe(const std::string& path);

// The ceilings for a run on `device` with `threads` CPU threads on `machine`: from `path` when
// given, else from the newest matching probe in the cache. The point with exactly `threads`
// threads is used, else the nearest below, else the smallest. nullopt with *why set when none.
std::optional<Ceilings> find_ceilings(const nlohmann::json& machine, const std::string& device, int threads,
                                      const std::string& path, std::string* why);

}  // namespace duet::profiler
