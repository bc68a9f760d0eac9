// Taking a capture of everything recorded, and ops' self times (see capture.h).
#include "engine/profiler/capture.h"
#include <algorithm>
#include <map>
#include "engine/backend.h"

namespace duet::profiler {

Capture capture() {
  Capture c;
  c.mode = timing_mode();
  c.ops = collect();
  c.steps = collect_steps();
  c.phases = collect_phase_marks();
  c.thread_names = thread_names();
  c.telemetry = telemetry_log();
  std::vector<Device> devices{Device::cpu()};
  auto note = [&](Device d) {
    if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
  };
  for (const OpEvent& e : c.ops) note(e.device);
  for (const StepEvent& s : c.steps)
    for (const auto& m : s.memory) note(m.device);
  for (Device d : devices) {
    try {
      c.memory.push_back({d, device_allocator(d).stats()});
    } catch (const std::exception&) {  // a device whose backend is gone: no counters to report
    }
  }
  c.process = read_process_memory();
  return c;
}

std::vector<int64_t> self_times(const std::vector<OpEvent>& ops) {
  std::vector<int64_t> self(ops.size());
  std::map<int, std::vector<size_t>> by_thread;
  for (size_t i = 0; i < ops.size(); ++i) {
    self[i] = ops[i].end_ns - ops[i].start_ns;
    by_thread[ops[i].thread].push_back(i);
  }
  for (auto& [thread, idx] : by_thread) {
    // Outer ops first when two start together, so the inner one finds its parent on the stack.
    std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
      if (ops[a].start_ns != ops[b].start_ns) return ops[a].start_ns < ops[b].start_ns;
      return ops[a].end_ns > ops[b].end_ns;
    });
    std::vector<size_t> open;
    for (size_t i : idx) {
      while (!open.empty() && ops[open.back()].end_ns <= ops[i].start_ns) open.pop_back();
      if (!open.empty() && ops[i].end_ns <= ops[open.back()].end_ns) self[open.back()] -= ops[i].end_ns - ops[i].start_ns;
      open.push_back(i);
    }
  }
  return self;
}

}  // namespace duet::profiler
