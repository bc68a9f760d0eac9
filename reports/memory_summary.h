// Memory summary: per device, the allocator's current and peak bytes by tag (activation,
// parameter, gradient, optimizer state, workspace, data), the op at which the peak was reached,
// and the process's resident memory as Linux counts it (VmRSS, VmHWM), which also holds what
// the allocators do not see (code, libraries, oneDNN's caches, the loader's buffers).
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/profiler/capture.h"

namespace duet::profiler {

// The "memory" object of a report. The peak op is the first recorded op after which the
// device's peak reached its highest recorded value; when the allocator's peak is higher than
// any op saw, the peak happened outside the recorded ops and peak_note says so.
nlohmann::json memory_json(const Capture& c);
std::string format_memory(const nlohmann::json& report);

}  // namespace duet::profiler
