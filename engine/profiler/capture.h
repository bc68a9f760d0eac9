// A capture: everything the profiler recorded in one session, taken in one piece (ops, steps,
// phase marks, telemetry, the allocators' counters and the process's memory at the end). Reports
// and traces are computed from a capture, never from the live profiler.
#pragma once
#include <string>
#include <utility>
#include <vector>
#include "engine/profiler/events.h"
#include "engine/profiler/proc.h"
#include "engine/profiler/telemetry.h"

namespace duet::profiler {

struct DeviceMemorySnapshot {
  Device device;
  MemoryStats stats;
};

struct Capture {
  TimingMode mode = TimingMode::per_op;
  std::vector<OpEvent> ops;  // sorted by start
  std::vector<StepEvent> steps;
  std::vector<PhaseMark> phases;
  std::vector<std::pair<int, std::string>> thread_names;
  TelemetryLog telemetry;
  std::vector<DeviceMemorySnapshot> memory;  // cpu, plus every other device ops or steps used
  ProcessMemory process;
};

// Collects everything recorded so far (call after recording stopped: collecting while ops are
// being recorded on other threads is a data race).
Capture capture();

// Self time of each op (its time minus the ops nested inside it on the same thread), in the
// order of `ops`. Ops do not nest today except when an op's kernel calls other front-ends (the
// data loader's data.wait around batch assembly); self time keeps the sums honest either way.
std::vector<int64_t> self_times(const std::vector<OpEvent>& ops);

}  // namespace duet::profiler
