// Chrome trace-event export (opens in https://ui.perfetto.dev and chrome://tracing): ops as
// complete ("X") events on their thread's track, steps and phases as spans on tracks of their
// own, allocator live bytes and telemetry as counter ("C") tracks. Timestamps are microseconds
// from the first recorded event.
#pragma once
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/profiler/capture.h"

namespace duet::profiler {

// Track ids: ops use OpEvent.thread; these sit apart from any real thread number.
inline constexpr int kStepTrack = 100000;
inline constexpr int kPhaseTrackBase = 200000;  // + thread

// The process track the events go on. A data-parallel run gives each rank its own (pid rank + 1,
// "rank r") and one time origin: each rank's clock reading at the end of one barrier, so that the
// ranks line up even across machines whose clocks differ.
struct TraceProcess {
  int pid = 1;
  std::string name = "duet";
  std::optional<int64_t> t0_ns;  // unset: the first recorded event
};

nlohmann::json chrome_trace(const Capture& c, const nlohmann::json& run_config = nlohmann::json::object(),
                            const TraceProcess& process = {});
void write_chrome_trace(const Capture& c, const std::string& path,
                        const nlohmann::json& run_config = nlohmann::json::object());
// One trace holding every given trace's events (each on its own process track); otherData is the
// first's, with "processes" counting them.
nlohmann::json merge_chrome_traces(const std::vector<nlohmann::json>& traces);
// The text written to a trace file (invalid UTF-8 in names replaced, not an error).
std::string trace_text(const nlohmann::json& trace);

}  // namespace duet::profiler
