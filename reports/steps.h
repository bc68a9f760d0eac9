// Step breakdown: each marked step's time split by phase, two ways. "ops" sums the self time of
// the ops the step's thread ran in each phase; "wall" is the time the thread spent in each
// phase (from phase marks, so it includes host work between ops); untracked = step time minus
// all op time: the overhead no op accounts for (framework code, Python-free as it is, autograd
// bookkeeping, allocation, waiting).
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/profiler/capture.h"

namespace duet::profiler {

constexpr int kNumPhases = 7;  // Phase::forward .. Phase::other
// Phases in the order reports list them (the order of one step).
const std::array<Phase, kNumPhases>& report_phase_order();

struct StepBreakdown {
  int64_t step = 0, images = 0, start_ns = 0, dur_ns = 0;
  std::array<int64_t, kNumPhases> ops_ns{};   // by static_cast<int>(Phase)
  std::array<int64_t, kNumPhases> wall_ns{};
  bool has_wall = false;                       // phase marks were recorded on the step's thread
  int64_t untracked_ns = 0;
  std::vector<StepEvent::DeviceMemory> memory;
};

std::vector<StepBreakdown> step_breakdowns(const Capture& c, const std::vector<int64_t>& self);

// The "steps" array and the "phases" summary object of a report (see docs/profiler.md).
nlohmann::json steps_json(const std::vector<StepBreakdown>& steps);
nlohmann::json phases_json(const std::vector<StepBreakdown>& steps);
nlohmann::json memory_stats_json(Device d, const MemoryStats& s);

// The step-breakdown text of a report (its "phases" and "steps"); per_step adds one line per step.
std::string format_step_breakdown(const nlohmann::json& report, bool per_step);

}  // namespace duet::profiler
