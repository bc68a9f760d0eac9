// The Chrome trace writer (see trace.h).
#include "reports/trace.h"
#include <algorithm>
#include <climits>
#include <map>
#include <set>
#include <fmt/format.h>
#include "reports/files.h"

namespace duet::profiler {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;

// Metadata first, then by time: Perfetto tolerates any order; chrome://tracing draws counters
// best when they are in time order.
void sort_events(nlohmann::json& ev) {
  std::stable_sort(ev.begin(), ev.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    const bool ma = a["ph"] == "M", mb = b["ph"] == "M";
    if (ma != mb) return ma;
    return a["ts"].get<double>() < b["ts"].get<double>();
  });
}
}  // namespace

nlohmann::json chrome_trace(const Capture& c, const nlohmann::json& run_config, const TraceProcess& process) {
  const int pid = process.pid;
  auto meta = [pid](const char* what, int tid, nlohmann::json args) -> nlohmann::json {
    return {{"name", what}, {"ph", "M"}, {"ts", 0}, {"pid", pid}, {"tid", tid}, {"args", std::move(args)}};
  };
  int64_t t0 = INT64_MAX;
  for (const OpEvent& e : c.ops) t0 = std::min(t0, e.start_ns);
  for (const StepEvent& s : c.steps) t0 = std::min(t0, s.start_ns);
  for (const PhaseMark& m : c.phases) t0 = std::min(t0, m.t_ns);
  for (const TelemetrySample& s : c.telemetry.samples) t0 = std::min(t0, s.t_ns);
  if (t0 == INT64_MAX) t0 = 0;
  if (process.t0_ns) t0 = *process.t0_ns;
  auto us = [&](int64_t ns) { return static_cast<double>(ns - t0) * 1e-3; };

  nlohmann::json ev = nlohmann::json::array();
  ev.push_back(meta("process_name", 0, {{"name", process.name}}));
  ev.push_back(meta("process_sort_index", 0, {{"sort_index", process.pid}}));
  std::map<int, std::string> names;
  for (const auto& [t, n] : c.thread_names) names[t] = n;
  std::set<int> threads;
  for (const OpEvent& e : c.ops) threads.insert(e.thread);
  for (const StepEvent& s : c.steps) threads.insert(s.thread);
  std::set<int> phase_threads;
  for (const PhaseMark& m : c.phases) phase_threads.insert(m.thread);
  std::set<int> step_threads;
  for (const StepEvent& s : c.steps) step_threads.insert(s.thread);

  if (!c.steps.empty()) {
    ev.push_back(meta("thread_name", kStepTrack, {{"name", "steps"}}));
    ev.push_back(meta("thread_sort_index", kStepTrack, {{"sort_index", -2}}));
  }
  for (int t : phase_threads) {
    ev.push_back(meta("thread_name", kPhaseTrackBase + t, {{"name", fmt::format("phases (thread {})", t)}}));
    ev.push_back(meta("thread_sort_index", kPhaseTrackBase + t, {{"sort_index", -1}}));
  }
  for (int t : threads) {
    std::string n = names.count(t) ? names[t] : fmt::format("thread {}", t);
    if (step_threads.count(t)) n += " (steps)";
    ev.push_back(meta("thread_name", t, {{"name", fmt::format("ops: {}", n)}}));
    ev.push_back(meta("thread_sort_index", t, {{"sort_index", t}}));
  }

  for (const StepEvent& s : c.steps)
    ev.push_back({{"name", fmt::format("step {}", s.step)},
                  {"cat", "step"},
                  {"ph", "X"},
                  {"ts", us(s.start_ns)},
                  {"dur", static_cast<double>(s.end_ns - s.start_ns) * 1e-3},
                  {"pid", pid},
                  {"tid", kStepTrack},
                  {"args", {{"images", s.images}, {"thread", s.thread}}}});

  // Phase spans: from each mark to the thread's next mark (the last one ends at the last event).
  int64_t t_end = t0;
  for (const OpEvent& e : c.ops) t_end = std::max(t_end, e.end_ns);
  for (const StepEvent& s : c.steps) t_end = std::max(t_end, s.end_ns);
  std::map<int, std::vector<const PhaseMark*>> marks;
  for (const PhaseMark& m : c.phases) marks[m.thread].push_back(&m);
  for (auto& [t, ms] : marks) {
    for (size_t i = 0; i < ms.size(); ++i) {
      const int64_t a = ms[i]->t_ns, b = i + 1 < ms.size() ? ms[i + 1]->t_ns : std::max(t_end, a);
      if (ms[i]->phase == Phase::other || b <= a) continue;  // "other" is the gap between phases
      ev.push_back({{"name", phase_name(ms[i]->phase)},
                    {"cat", "phase"},
                    {"ph", "X"},
                    {"ts", us(a)},
                    {"dur", static_cast<double>(b - a) * 1e-3},
                    {"pid", pid},
                    {"tid", kPhaseTrackBase + t}});
    }
  }

  const std::vector<int64_t> self = self_times(c.ops);
  for (size_t i = 0; i < c.ops.size(); ++i) {
    const OpEvent& e = c.ops[i];
    const double dur_ns = static_cast<double>(e.end_ns - e.start_ns);
    nlohmann::json args = {{"phase", phase_name(e.phase)}, {"backend", backend_label(e)}, {"dtype", dtype_name(e.dtype)},
                           {"device", e.device.str()},      {"shapes", e.shapes},                 {"scope", e.scope},
                           {"flops", e.flops},              {"bytes", e.bytes},                   {"self_us", static_cast<double>(self[i]) * 1e-3},
                           {"bytes_allocated", e.bytes_allocated}, {"live_bytes", e.live_bytes}};
    if (!e.impl.empty()) args["impl"] = e.impl;
    if (e.flops > 0 && dur_ns > 0) args["GFLOP/s"] = e.flops / dur_ns;
    if (e.bytes > 0 && dur_ns > 0) args["GB/s"] = e.bytes / dur_ns;
    ev.push_back({{"name", e.name},
                  {"cat", phase_name(e.phase)},
                  {"ph", "X"},
                  {"ts", us(e.start_ns)},
                  {"dur", dur_ns * 1e-3},
                  {"pid", pid},
                  {"tid", e.thread},
                  {"args", std::move(args)}});
    ev.push_back({{"name", fmt::format("live memory {}", e.device.str())},
                  {"ph", "C"},
                  {"ts", us(e.end_ns)},
                  {"pid", pid},
                  {"tid", 0},
                  {"args", {{"MiB", static_cast<double>(e.live_bytes) / kMiB}}}});
  }
  for (const StepEvent& s : c.steps)
    for (const auto& m : s.memory)
      ev.push_back({{"name", fmt::format("live memory {}", m.device.str())},
                    {"ph", "C"},
                    {"ts", us(s.end_ns)},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{"MiB", static_cast<double>(m.stats.current) / kMiB}}}});

  for (const TelemetrySample& s : c.telemetry.samples) {
    for (size_t i = 0; i < c.telemetry.channels.size() && i < s.values.size(); ++i) {
      if (!s.values[i]) continue;  // absent readings are left out: a counter has no "null"
      const TelemetryChannel& ch = c.telemetry.channels[i];
      const bool bytes = ch.unit == "bytes";
      std::string name = ch.name;
      if (bytes && name.size() > 6 && name.compare(name.size() - 6, 6, "_bytes") == 0) name.resize(name.size() - 6);
      ev.push_back({{"name", bytes ? name + " (MiB)" : name},
                    {"ph", "C"},
                    {"ts", us(s.t_ns)},
                    {"pid", pid},
                    {"tid", 0},
                    {"args", {{bytes ? "MiB" : ch.unit, bytes ? *s.values[i] / kMiB : *s.values[i]}}}});
    }
  }
  sort_events(ev);
  return {{"traceEvents", ev},
          {"displayTimeUnit", "ms"},
          {"otherData",
           {{"schema", "duet.trace/1"},
            {"timing_mode", timing_mode_name(c.mode)},
            {"t0_ns", t0},
            {"run_config", run_config.is_object() ? run_config : nlohmann::json::object()}}}};
}

std::string trace_text(const nlohmann::json& trace) {
  return trace.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void write_chrome_trace(const Capture& c, const std::string& path, const nlohmann::json& run_config) {
  write_file_atomic(path, trace_text(chrome_trace(c, run_config)));
}

nlohmann::json merge_chrome_traces(const std::vector<nlohmann::json>& traces) {
  if (traces.empty()) return chrome_trace(Capture{});
  nlohmann::json merged = traces.front();
  nlohmann::json& ev = merged["traceEvents"];
  for (size_t i = 1; i < traces.size(); ++i)
    for (const nlohmann::json& e : traces[i]["traceEvents"]) ev.push_back(e);
  sort_events(ev);
  merged["otherData"]["processes"] = traces.size();
  return merged;
}

}  // namespace duet::profiler
