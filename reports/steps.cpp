// The step breakdown by phase and its JSON and text forms (see steps.h).
#include "reports/steps.h"
#include <algorithm>
#include <fmt/format.h>
#include "reports/records.h"
#include "reports/text_table.h"

namespace duet::profiler {

const std::array<Phase, kNumPhases>& report_phase_order() {
  static const std::array<Phase, kNumPhases> order{Phase::data,      Phase::copy, Phase::forward, Phase::backward,
                                                   Phase::optimizer, Phase::comm, Phase::other};
  return order;
}

std::vector<StepBreakdown> step_breakdowns(const Capture& c, const std::vector<int64_t>& self) {
  std::vector<StepBreakdown> out;
  for (const StepEvent& s : c.steps) {
    StepBreakdown b;
    b.step = s.step;
    b.images = s.images;
    b.start_ns = s.start_ns;
    b.dur_ns = s.end_ns - s.start_ns;
    b.memory = s.memory;
    // Ops are sorted by start: jump to the first one at or after the step's start.
    auto first = std::lower_bound(c.ops.begin(), c.ops.end(), s.start_ns,
                                  [](const OpEvent& e, int64_t t) { return e.start_ns < t; });
    int64_t op_sum = 0;
    for (auto it = first; it != c.ops.end() && it->start_ns < s.end_ns; ++it) {
      if (it->thread != s.thread) continue;
      const int64_t t = self[static_cast<size_t>(it - c.ops.begin())];
      b.ops_ns[static_cast<int>(it->phase)] += t;
      op_sum += t;
    }
    b.untracked_ns = b.dur_ns - op_sum;
    // Walk the thread's phase marks across the step.
    Phase cur = Phase::other;
    int64_t t = s.start_ns;
    for (const PhaseMark& m : c.phases) {
      if (m.thread != s.thread) continue;
      b.has_wall = true;
      if (m.t_ns <= s.start_ns) {
        cur = m.phase;
        continue;
      }
      if (m.t_ns >= s.end_ns) break;
      b.wall_ns[static_cast<int>(cur)] += m.t_ns - t;
      t = m.t_ns;
      cur = m.phase;
    }
    b.wall_ns[static_cast<int>(cur)] += s.end_ns - t;
    out.push_back(std::move(b));
  }
  return out;
}

namespace {
nlohmann::json by_phase(const std::array<int64_t, kNumPhases>& v) {
  nlohmann::json j = nlohmann::json::object();
  for (Phase p : report_phase_order()) j[phase_name(p)] = v[static_cast<int>(p)];
  return j;
}
nlohmann::json by_phase(const std::array<double, kNumPhases>& v) {
  nlohmann::json j = nlohmann::json::object();
  for (Phase p : report_phase_order()) j[phase_name(p)] = v[static_cast<int>(p)];
  return j;
}
nlohmann::json tags_json(const std::array<int64_t, kNumMemTags>& v) {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < kNumMemTags; ++i) j[mem_tag_name(static_cast<MemTag>(i))] = v[static_cast<size_t>(i)];
  return j;
}
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

nlohmann::json memory_stats_json(Device d, const MemoryStats& s) {
  return {{"device", d.str()},        {"current", s.current},         {"peak", s.peak},
          {"cached", s.cached},       {"allocations", s.allocations}, {"frees", s.frees},
          {"by_tag", tags_json(s.by_tag)}, {"peak_by_tag", tags_json(s.peak_by_tag)}};
}

nlohmann::json steps_json(const std::vector<StepBreakdown>& steps) {
  nlohmann::json a = nlohmann::json::array();
  for (const StepBreakdown& b : steps) {
    nlohmann::json mem = nlohmann::json::array();
    for (const auto& m : b.memory) mem.push_back(memory_stats_json(m.device, m.stats));
    a.push_back({{"step", b.step},
                 {"images", b.images},
                 {"start_ns", b.start_ns},
                 {"dur_ns", b.dur_ns},
                 {"ops_ns", by_phase(b.ops_ns)},
                 {"wall_ns", b.has_wall ? by_phase(b.wall_ns) : nlohmann::json(nullptr)},
                 {"untracked_ns", b.untracked_ns},
                 {"memory", mem}});
  }
  return a;
}

nlohmann::json phases_json(const std::vector<StepBreakdown>& steps) {
  const double n = static_cast<double>(steps.size());
  std::array<double, kNumPhases> ops{}, wall{};
  std::vector<double> durs;
  double images = 0, total = 0, untracked = 0;
  bool has_wall = !steps.empty();
  for (const StepBreakdown& b : steps) {
    for (int p = 0; p < kNumPhases; ++p) {
      ops[static_cast<size_t>(p)] += static_cast<double>(b.ops_ns[static_cast<size_t>(p)]) / n;
      wall[static_cast<size_t>(p)] += static_cast<double>(b.wall_ns[static_cast<size_t>(p)]) / n;
    }
    has_wall = has_wall && b.has_wall;
    untracked += static_cast<double>(b.untracked_ns) / n;
    durs.push_back(static_cast<double>(b.dur_ns));
    total += static_cast<double>(b.dur_ns);
    images += static_cast<double>(b.images);
  }
  const auto mm = std::minmax_element(durs.begin(), durs.end());
  return {{"steps", steps.size()},
          {"mean_step_ns", n > 0 ? total / n : 0},
          {"median_step_ns", median(durs)},
          {"min_step_ns", durs.empty() ? 0 : *mm.first},
          {"max_step_ns", durs.empty() ? 0 : *mm.second},
          {"images", images},
          {"images_per_s", total > 0 && images > 0 ? nlohmann::json(images / (total * 1e-9)) : nlohmann::json(nullptr)},
          {"mean_ops_ns", by_phase(ops)},
          {"mean_wall_ns", has_wall ? by_phase(wall) : nlohmann::json(nullptr)},
          {"mean_untracked_ns", untracked}};
}

std::string format_step_breakdown(const nlohmann::json& r, bool per_step) {
  const nlohmann::json& ph = r.at("phases");
  const int64_t n = ph.value("steps", int64_t{0});
  const std::string mode = r.value("timing_mode", std::string("?"));
  if (n == 0) return "step breakdown: no steps were marked (profiler::step_begin / step_end)\n";
  const bool per_op = mode == "per-op";
  const double step = ph.value("mean_step_ns", 0.0);
  const bool wall = member(ph, "mean_wall_ns").is_object();
  std::string s = fmt::format("step breakdown ({} timing; mean of {} steps)\n", mode, n);
  TextTable t;
  t.column("phase", TextTable::left);
  t.column("ops ms");
  t.column("% step");
  if (wall) {
    t.column("wall ms");
    t.column("% step");
  }
  auto pct = [&](double v) { return step > 0 ? fmt_pct(v / step) : std::string("-"); };
  for (Phase p : report_phase_order()) {
    const char* name = phase_name(p);
    const double o = member(ph, "mean_ops_ns").value(name, 0.0);
    const double w = wall ? member(ph, "mean_wall_ns").value(name, 0.0) : 0.0;
    if (o == 0 && w == 0) continue;
    std::vector<std::string> row{name,
                                 per_op ? fmt_ms(o) : "-", per_op ? pct(o) : "-"};
    if (wall) {
      row.push_back(fmt_ms(w));
      row.push_back(pct(w));
    }
    t.row(row);
  }
  if (per_op) {
    const double u = ph.value("mean_untracked_ns", 0.0);
    std::vector<std::string> row{"untracked (step - ops)", fmt_ms(u), pct(u)};
    t.row(row);
  }
  t.rule();
  std::vector<std::string> total{"step", fmt_ms(step), "100.0%"};
  if (wall) {
    total.push_back(fmt_ms(step));
    total.push_back("100.0%");
  }
  t.row(total);
  s += t.str("  ");
  s += fmt::format("  step time: mean {} ms, median {} ms, min {} ms, max {} ms", fmt_ms(step),
                   fmt_ms(ph.value("median_step_ns", 0.0)), fmt_ms(ph.value("min_step_ns", 0.0)),
                   fmt_ms(ph.value("max_step_ns", 0.0)));
  if (member(ph, "images_per_s").is_number())
    s += fmt::format("; {:.0f} images/step; {:.1f} images/s (all images / all step time)",
                     ph.value("images", 0.0) / static_cast<double>(n), member(ph, "images_per_s").get<double>());
  s += "\n";
  if (!per_op) s += "  (throughput mode: no per-op events, so no ops column; wall times come from phase marks)\n";
  if (per_step && r.contains("steps")) {
    // Only the phases that occur at all (comm is empty without data parallelism).
    std::vector<Phase> used;
    for (Phase p : report_phase_order())
      if (member(ph, "mean_ops_ns").value(phase_name(p), 0.0) > 0 || (wall && member(ph, "mean_wall_ns").value(phase_name(p), 0.0) > 0))
        used.push_back(p);
    TextTable st;
    st.column("step");
    st.column("ms");
    st.column("images");
    for (Phase p : used) st.column(phase_name(p));
    st.column("untracked");
    st.column("live MiB");
    st.column("peak MiB");
    for (const auto& b : member(r, "steps")) {
      const nlohmann::json& src = per_op ? member(b, "ops_ns") : member(b, "wall_ns");
      std::vector<std::string> row{std::to_string(b.value("step", int64_t{0})), fmt_ms(b.value("dur_ns", 0.0)),
                                   std::to_string(b.value("images", int64_t{0}))};
      for (Phase p : used) row.push_back(src.is_object() ? fmt_ms(src.value(phase_name(p), 0.0)) : "-");
      row.push_back(per_op ? fmt_ms(b.value("untracked_ns", 0.0)) : "-");
      const auto& mem = member(b, "memory");
      const nlohmann::json m = mem.is_array() && !mem.empty() ? mem.back() : nlohmann::json::object();
      row.push_back(fmt_mib(m.value("current", 0.0)));
      row.push_back(fmt_mib(m.value("peak", 0.0)));
      st.row(row);
    }
    s += fmt::format("per step ({} ms per phase; memory of the step's device at its end)\n", per_op ? "op" : "wall");
    s += st.str("  ");
  }
  return s;
}

}  // namespace duet::profiler
