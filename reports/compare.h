// `duet compare A.json B.json ...`: runs side by side (CPU vs CUDA, batch 64 vs 128, reference vs
// oneDNN) per phase, per op and per layer, each value with its ratio to the first report, and
// the ops whose share of step time moved most. Reports of different models are still compared
// per op and phase (with a warning line); per-layer rows need the same model and are skipped.
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace duet::profiler {

struct NamedReport {
  std::string name;  // shown in column headers (usually the file name)
  nlohmann::json report;
};

// Structured comparison (schema "duet.compare/1"); throws duet::Error for fewer than 2 reports
// or a report that fails validate_report.
nlohmann::json compare(const std::vector<NamedReport>& reports);
// Loads each path (load_report) and compares; the names are the paths.
nlohmann::json compare_files(const std::vector<std::string>& paths);
// Text: warnings first, then phases, ops (top rows by the first report's time), share shifts,
// layers. `top` = 0 prints every row.
std::string format_compare(const nlohmann::json& cmp, size_t top = 25);

}  // namespace duet::profiler
