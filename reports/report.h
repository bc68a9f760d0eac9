// The profile report: one JSON document (schema "duet.profile/1", documented in
// docs/profiler.md) built from a capture, and the text views printed from it. The text is always
// printed from the JSON, so `duet report saved.json` shows exactly what the run printed.
#pragma once
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/profiler/capture.h"
#include "reports/op_summary.h"
#include "reports/records.h"
#include "reports/roofline.h"

namespace duet::profiler {

inline constexpr const char* kReportSchema = "duet.profile/1";

struct ReportOptions {
  std::string probe_path;  // "" = the newest matching probe in the cache
  bool use_probe = true;   // false: no roofline columns (tests)
};

// machine, run_config (free-form, passed through), timing_mode, roofline, totals, op_records,
// op_table, layer_table, phases, steps, memory, telemetry. When steps were marked, only ops that
// started inside a step are tabled; the others are counted in totals.ops_outside_steps.
nlohmann::json build_report(const Capture& c, const nlohmann::json& run_config, const ReportOptions& o = {});

// Reads and validates a report: a missing file, invalid JSON, another schema, or a missing
// section is a duet::Error naming the file and what was expected.
nlohmann::json load_report(const std::string& path);
void validate_report(const nlohmann::json& r, const std::string& source);

std::vector<OpRecord> records_of(const nlohmann::json& report);
TableBasis basis_of(const nlohmann::json& report);
std::optional<Ceilings> ceilings_of(const nlohmann::json& report);

struct PrintOptions {
  TableOptions table;
  size_t top = 20;          // op (and layer) table rows; 0 = all
  bool ops = true;          // the operator table
  bool layers = false;      // the per-layer table
  bool steps = true;        // the step breakdown
  bool per_step = false;    // one line per step
  bool memory = true;
  bool telemetry = true;    // a one-line telemetry summary
  std::optional<Ceilings> ceilings;  // replaces the report's own (report --probe)
};
std::string format_report(const nlohmann::json& report, const PrintOptions& o);
std::string format_header(const nlohmann::json& report);

// The op table of a report as CSV (rows as PrintOptions.table groups and sorts them).
std::string report_csv(const nlohmann::json& report, const TableOptions& o);

// Writes the report JSON (and, when csv_path is not empty, the op table as CSV), atomically.
void write_report(const nlohmann::json& report, const std::string& json_path, const std::string& csv_path = "");

}  // namespace duet::profiler
