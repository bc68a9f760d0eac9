// Starting and stopping a profiling session (see session.h).
#include "engine/profiler/session.h"
#include "engine/backend.h"
#include "engine/profiler/telemetry.h"

namespace duet::profiler {

void start_session(const SessionOptions& o) {
  enable(false);
  enable_throughput(false);
  clear();
  device_allocator(Device::cpu()).reset_peak();
  if (o.device != Device::cpu()) device_allocator(o.device).reset_peak();
  set_sync_per_op(o.sync_per_op);
  if (o.telemetry_ms > 0) start_telemetry(o.telemetry_ms);
  if (o.mode == TimingMode::per_op) enable(true);
  else enable_throughput(true);
}

void stop_session() {
  enable(false);
  enable_throughput(false);
  stop_telemetry();
}

}  // namespace duet::profiler
