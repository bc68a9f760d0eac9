// Chrome trace-event export (opens in https://ui.perfetto.dev and chrome://tracing): ops as
// complete ("X") events on their thread's track, steps and phases as spans on tracks of their
// own, allocator live bytes and telemetry as counter ("C") tracks. Timestamps are microseconds
// from the first recorded event.
#pragma once
#include <string>
#include <nlohmann/json.hpp>
#include "engine/profiler/capture.h"

namespace duet::profiler {

// Track ids: ops use OpEvent.thread; these sit apart from any real thread number.
inline constexpr int kStepTrack = 100000;
inline constexpr int kPhaseTrackBase = 200000;  // + thread

nlohmann::json chrome_trace(const Capture& c, const nlohmann::json& run_config = nlohmann::json::object());
void write_chrome_trace(const Capture& c, const std::string& path,
                        const nlohmann::json& run_config = nlohmann::json::object());

}  // namespace duet::profiler
