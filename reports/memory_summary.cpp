// The memory summary of a report (see memory_summary.h): per device, current and peak bytes by tag.
#include "reports/memory_summary.h"
#include <algorithm>
#include <fmt/format.h>
#include "reports/steps.h"
#include "reports/records.h"
#include "reports/text_table.h"

namespace duet::profiler {

namespace {
nlohmann::json opt_bytes(const std::optional<int64_t>& v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); }

// The step (by number) whose window holds time t, or null.
nlohmann::json step_at(const Capture& c, int64_t t) {
  for (const StepEvent& s : c.steps)
    if (t >= s.start_ns && t < s.end_ns) return s.step;
  return nullptr;
}
}  // namespace

nlohmann::json memory_json(const Capture& c) {
  nlohmann::json devices = nlohmann::json::array();
  for (const DeviceMemorySnapshot& d : c.memory) {
    nlohmann::json j = memory_stats_json(d.device, d.stats);
    int64_t best = -1;
    size_t at = 0;
    for (size_t i = 0; i < c.ops.size(); ++i) {
      if (c.ops[i].device != d.device) continue;
      if (c.ops[i].peak_bytes > best) {  // strictly greater: the first op to reach the maximum
        best = c.ops[i].peak_bytes;
        at = i;
      }
    }
    if (best < 0) {
      j["peak_op"] = nullptr;
      j["peak_note"] = "no op of this device was recorded";
    } else {
      // Ops open before they allocate their outputs, so a peak an op's outputs or workspace made
      // rose inside its window. One that was already there when the op started was reached
      // between ops: by an allocation outside any op, or by another thread.
      const OpEvent& e = c.ops[at];
      const bool inside = e.peak_bytes > e.peak_before;
      j["peak_op"] = {{"index", at},
                      {"name", e.name},
                      {"phase", phase_name(e.phase)},
                      {"scope", e.scope},
                      {"shapes", e.shapes},
                      {"step", step_at(c, e.start_ns)},
                      {"peak_bytes", e.peak_bytes},
                      {"live_bytes_after", e.live_bytes},
                      {"bytes_allocated", e.bytes_allocated},
                      {"inside", inside}};
      if (d.stats.peak > best)
        j["peak_note"] = fmt::format("the allocator's peak ({}) is higher than any recorded op saw ({}): it was "
                                     "reached outside the recorded ops (before profiling, or after the last op)",
                                     fmt_bytes(static_cast<double>(d.stats.peak)), fmt_bytes(static_cast<double>(best)));
      else if (!inside)
        j["peak_note"] = fmt::format("the peak was already reached when op #{} {} started: an allocation between ops "
                                     "made it (code outside any op, or another thread), not this op",
                                     at, e.name);
      else
        j["peak_note"] = "";
    }
    devices.push_back(j);
  }
  return {{"devices", devices},
          {"process", {{"rss_bytes", opt_bytes(c.process.rss_bytes)}, {"hwm_bytes", opt_bytes(c.process.hwm_bytes)}}}};
}

std::string format_memory(const nlohmann::json& r) {
  const nlohmann::json& m = r.at("memory");
  std::string s = "memory (allocator counters at the end of the run; peak since profiling started)\n";
  for (const auto& d : m.at("devices")) {
    s += fmt::format("  {}: current {}, peak {}", d.value("device", std::string("?")), fmt_bytes(d.value("current", 0.0)),
                     fmt_bytes(d.value("peak", 0.0)));
    if (d.value("cached", 0.0) > 0) s += fmt::format(", cached {}", fmt_bytes(d.value("cached", 0.0)));
    s += fmt::format(", {} allocations, {} frees\n", d.value("allocations", int64_t{0}), d.value("frees", int64_t{0}));
    const auto& op = member(d, "peak_op");
    if (op.is_object()) {
      s += fmt::format("  peak reached {} op #{} {} ({}{}{}, {})", op.value("inside", true) ? "at" : "before",
                       op.value("index", int64_t{0}),
                       op.value("name", std::string("?")), op.value("phase", std::string("?")),
                       op.value("scope", std::string()).empty() ? "" : ", ",
                       op.value("scope", std::string()), op.value("shapes", std::string()));
      if (is_int64(member(op, "step"))) s += fmt::format(" in step {}", member(op, "step").get<int64_t>());
      s += fmt::format(": {} live after it, {} allocated by it\n", fmt_bytes(op.value("live_bytes_after", 0.0)),
                       fmt_bytes(op.value("bytes_allocated", 0.0)));
    }
    const std::string note = d.value("peak_note", std::string());
    if (!note.empty()) s += "  note: " + note + "\n";
    TextTable t;
    t.column("tag", TextTable::left);
    t.column("current MiB");
    t.column("peak MiB");
    for (auto it = member(d, "by_tag").begin(); it != member(d, "by_tag").end(); ++it) {
      const double cur = it.value().get<double>();
      const double peak = member(d, "peak_by_tag").value(it.key(), 0.0);
      if (cur == 0 && peak == 0) continue;
      t.row({it.key(), fmt_mib(cur), fmt_mib(peak)});
    }
    s += t.str("    ");
  }
  const auto& p = m.at("process");
  auto opt = [](const nlohmann::json& v) { return v.is_number() ? fmt_bytes(v.get<double>()) : std::string("n/a"); };
  s += fmt::format("  process: RSS {} now, {} at most (VmRSS/VmHWM; includes code, libraries and caches)\n",
                   opt(member(p, "rss_bytes")), opt(member(p, "hwm_bytes")));
  return s;
}

}  // namespace duet::profiler
