// How the profiler times ops on a device that queues work asynchronously, without waiting for each
// op. The host clock would only see when an op was launched, so in per-op mode the profiler asks
// the op's backend for a marker on the device's stream where the op begins and one where it ends
// (CUDA: a cudaEvent from a pool). The markers are turned into host-clock timestamps in one go at
// profiler::step_end (one device synchronisation per step), or when events are collected.
//
// The engine owns this interface and knows no device API: the CUDA backend registers its
// implementation (backends/cuda/event_timer.h) when it is created. A backend without one, or
// profiler::set_sync_per_op(true), gets the older scheme: synchronise before and after each op and
// read the host clock.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>
#include "engine/device.h"

namespace duet::profiler {

class DeviceTimer {
public:
  virtual ~DeviceTimer() = default;
  // Starts a new timeline on device d (a step begins): a reference marker is recorded on d's
  // stream and tied to the host clock's now. Markers recorded later are measured from it.
  virtual void begin_timeline(Device d) = 0;
  // Records a marker on the stream of device d (when d is not a device of this backend, e.g. the
  // host side of a host-to-device copy: the backend's current device) and returns its id, or -1
  // when none could be recorded (no device). Never throws: OpScope calls it from its destructor.
  virtual int64_t mark(Device d) noexcept = 0;
  // Waits for the markers `ids` to be reached and returns each one's time on the host clock
  // (profiler::now_ns()), in order; those markers are recycled. At most one wait per device. An
  // id the timer no longer knows (discarded meanwhile) gives -1.
  virtual std::vector<int64_t> resolve(const std::vector<int64_t>& ids) = 0;
  // Markers recorded and not yet resolved.
  virtual size_t pending() const = 0;
  // Forgets every pending marker without waiting (profiler::clear() dropped their events).
  virtual void discard() = 0;
};

// Registered by a backend when it is created (nullptr unregisters); at most one per backend kind.
void set_device_timer(Backend b, DeviceTimer* timer);
DeviceTimer* device_timer(Backend b);

}  // namespace duet::profiler
