// A profiling session, the way the trainer uses the profiler:
//   profiler::start_session({.mode = TimingMode::per_op});
//   for each step: profiler::step_begin(step, batch, device); ...; profiler::step_end();
//   profiler::stop_session();
//   auto report = profiler::build_report(profiler::capture(), run_config);
#pragma once
#include "engine/device.h"
#include "engine/profiler/events.h"

namespace duet::profiler {

struct SessionOptions {
  TimingMode mode = TimingMode::per_op;
  int telemetry_ms = 100;      // sampling interval; 0: no telemetry thread
  Device device = Device::cpu();  // its allocator's peak is reset (the cpu's always is)
  // Per-op mode on CUDA: synchronise around every op and time it on the host clock instead of with
  // CUDA events resolved once per step (profiler::set_sync_per_op).
  bool sync_per_op = false;
};

// Clears earlier events, resets the allocators' peaks so the memory peak is this session's,
// starts telemetry and turns recording on in the chosen mode.
void start_session(const SessionOptions& o = {});
// Turns recording off and stops telemetry; the recorded data stays until clear().
void stop_session();

}  // namespace duet::profiler
