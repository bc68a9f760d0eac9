// The CUDA backend's profiler::DeviceTimer: per-op timing with cudaEvents instead of a device
// synchronisation around every op. OpScope records an event on the device's compute stream where
// an op begins and ends (events come from a reusable pool per device); profiler::step_begin records
// a reference event while the device is idle and reads the host clock; profiler::step_end, after
// its one synchronisation, converts every marker with cudaEventElapsedTime(reference, marker) into
// reference host time + elapsed. The bookkeeping is event_timeline.h's (tested without a GPU).
#pragma once
#include "engine/profiler/device_timer.h"

namespace duet::cuda {

// The process-wide timer (created on first use, never destroyed: its events may outlive the
// runtime at exit). The CUDA backend registers it with the profiler when it is created.
profiler::DeviceTimer& event_timer();

}  // namespace duet::cuda
