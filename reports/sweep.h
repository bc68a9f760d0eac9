// Batch-size sweeps (`duet profile --model M --batch 16,32,64,...`): one throughput run per batch
// size, summarised as a table and a JSON document (schema "duet.sweep/1") that
// scripts/plot_profile.py turns into a throughput-vs-batch plot. Running the sweep needs the
// trainer and the model registry; this file holds what it prints and writes.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace duet::profiler {

struct SweepPoint {
  int64_t batch = 0;
  int64_t steps = 0;
  std::optional<double> images_per_s;  // absent when the run failed
  std::optional<double> median_step_ms;
  std::optional<int64_t> peak_bytes;   // the device allocator's peak during the run
  std::string timing_mode;             // of the run that produced the point
  std::string error;                   // why the point failed ("out of memory: ..."); "" when it ran
  std::string report_path;             // the batch size's own profile report, when written
};

// "16,32,64" -> {16, 32, 64}; throws duet::Error naming the bad item (positive integers only).
std::vector<int64_t> parse_batch_list(const std::string& s);

// A point from a batch size's report (phases.images_per_s, median step, the device's peak).
SweepPoint sweep_point_from_report(int64_t batch, const nlohmann::json& report);

// {"schema": "duet.sweep/1", "run_config": {...}, "points": [{"batch", "steps", "images_per_s",
//  "median_step_ms", "peak_bytes", "timing_mode", "error", "report"}]}; absent values are null.
nlohmann::json sweep_json(const nlohmann::json& run_config, const std::vector<SweepPoint>& points);
std::vector<SweepPoint> sweep_points_from_json(const nlohmann::json& sweep);  // validates the schema
std::string format_sweep_table(const std::vector<SweepPoint>& points);

}  // namespace duet::profiler
