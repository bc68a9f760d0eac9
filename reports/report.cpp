// The profile report (see report.h): built from a capture, validated when read, printed as text.
#include "reports/report.h"
#include <algorithm>
#include <ctime>
#include <functional>
#include <map>
#include <fmt/format.h>
#include "engine/error.h"
#include "reports/files.h"
#include "engine/profiler/machine.h"
#include "reports/memory_summary.h"
#include "reports/probe.h"
#include "reports/steps.h"
#include "reports/text_table.h"

namespace duet::profiler {

namespace {

// The device the run computed on: the steps' device, else the one with the most op time.
std::string run_device(const Capture& c) {
  for (const StepEvent& s : c.steps)
    if (!s.memory.empty()) return s.memory.back().device.str();
  std::map<std::string, int64_t> t;
  for (const OpEvent& e : c.ops) t[e.device.str()] += e.end_ns - e.start_ns;
  std::string best = "cpu";
  int64_t most = -1;
  for (auto& [d, ns] : t)
    if (ns > most) {
      most = ns;
      best = d;
    }
  return best;
}

nlohmann::json telemetry_json(const TelemetryLog& log) {
  if (log.samples.empty()) return nullptr;
  nlohmann::json channels = nlohmann::json::array(), samples = nlohmann::json::array(),
                 summary = nlohmann::json::object();
  for (const TelemetryChannel& ch : log.channels)
    channels.push_back({{"name", ch.name}, {"unit", ch.unit}, {"source", ch.source}});
  std::vector<double> sum(log.channels.size()), mx(log.channels.size(), -1e300);
  std::vector<int64_t> n(log.channels.size());
  for (const TelemetrySample& s : log.samples) {
    nlohmann::json v = nlohmann::json::array();
    for (size_t i = 0; i < log.channels.size(); ++i) {
      const auto& x = i < s.values.size() ? s.values[i] : std::optional<double>();
      v.push_back(x ? nlohmann::json(*x) : nlohmann::json(nullptr));
      if (x) {
        sum[i] += *x;
        mx[i] = std::max(mx[i], *x);
        n[i]++;
      }
    }
    samples.push_back({{"t_ns", s.t_ns}, {"values", v}});
  }
  for (size_t i = 0; i < log.channels.size(); ++i)
    summary[log.channels[i].name] = n[i] > 0 ? nlohmann::json{{"mean", sum[i] / static_cast<double>(n[i])}, {"max", mx[i]}}
                                             : nlohmann::json(nullptr);
  return {{"interval_ms", log.interval_ms}, {"channels", channels}, {"samples", samples}, {"summary", summary}};
}

const nlohmann::json& section(const nlohmann::json& r, const char* key, nlohmann::json::value_t type, const char* what,
                              const std::string& source) {
  DUET_CHECK(r.contains(key), "report '{}' lacks its \"{}\" section: expected {}", source, key, what);
  const nlohmann::json& v = r[key];
  DUET_CHECK(v.type() == type || (type == nlohmann::json::value_t::number_integer && v.is_number()),
             "report '{}': \"{}\" is {}, expected {}", source, key, v.type_name(), what);
  return v;
}

}  // namespace

nlohmann::json build_report(const Capture& c, const nlohmann::json& run_config, const ReportOptions& o) {
  const std::vector<int64_t> self = self_times(c.ops);
  // Only ops inside steps are tabled when steps were marked, so "% step" means what it says.
  std::vector<OpEvent> kept;
  std::vector<int64_t> kept_self;
  int64_t outside = 0, outside_ns = 0;
  std::vector<std::pair<int64_t, int64_t>> windows;
  for (const StepEvent& s : c.steps) windows.emplace_back(s.start_ns, s.end_ns);
  std::sort(windows.begin(), windows.end());
  for (size_t i = 0; i < c.ops.size(); ++i) {
    bool in = windows.empty();
    if (!in) {
      auto it = std::upper_bound(windows.begin(), windows.end(), std::pair{c.ops[i].start_ns, INT64_MAX});
      in = it != windows.begin() && c.ops[i].start_ns < std::prev(it)->second;
    }
    if (in) {
      kept.push_back(c.ops[i]);
      kept_self.push_back(self[i]);
    } else {
      ++outside;
      outside_ns += self[i];
    }
  }
  const std::vector<OpRecord> records = aggregate(kept, kept_self);
  const std::vector<StepBreakdown> steps = step_breakdowns(c, self);

  nlohmann::json r;
  r["schema"] = kReportSchema;
  r["created"] = utc_now();
  r["timing_mode"] = timing_mode_name(c.mode);
  r["machine"] = machine_info();
  r["run_config"] = run_config.is_object() ? run_config : nlohmann::json::object();
  const std::string device = run_device(c);
  std::optional<Ceilings> ceilings;
  std::string note;
  if (o.use_probe) ceilings = find_ceilings(r["machine"], device, r["machine"].value("threads_used", 0), o.probe_path, &note);
  else note = "no probe: roofline disabled for this report";
  r["roofline"] = roofline_json(ceilings, note);

  int64_t step_ns = 0, images = 0, op_ns = 0;
  for (const StepBreakdown& b : steps) {
    step_ns += b.dur_ns;
    images += b.images;
  }
  for (int64_t t : kept_self) op_ns += t;
  r["totals"] = {{"device", device},
                 {"steps", steps.size()},
                 {"step_ns", step_ns},
                 {"images", images},
                 {"images_per_s", step_ns > 0 && images > 0 ? nlohmann::json(static_cast<double>(images) / (step_ns * 1e-9))
                                                             : nlohmann::json(nullptr)},
                 {"ops", kept.size()},
                 {"op_self_ns", op_ns},
                 {"pct_basis", steps.empty() ? "ops" : "step"},
                 {"ops_outside_steps", {{"count", outside}, {"self_ns", outside_ns}}}};
  nlohmann::json recs = nlohmann::json::array();
  for (const OpRecord& rec : records) recs.push_back(to_json(rec));
  r["op_records"] = recs;
  const TableBasis basis = basis_of(r);
  nlohmann::json ops = nlohmann::json::array(), layers = nlohmann::json::array();
  for (const TableRow& row : op_table(records, basis, ceilings, {})) ops.push_back(to_json(row));
  for (const TableRow& row : layer_table(records, basis, ceilings, {})) layers.push_back(to_json(row));
  r["op_table"] = ops;
  r["layer_table"] = layers;
  r["phases"] = phases_json(steps);
  r["steps"] = steps_json(steps);
  r["memory"] = memory_json(c);
  r["telemetry"] = telemetry_json(c.telemetry);
  return r;
}

void validate_report(const nlohmann::json& r, const std::string& source) {
  DUET_CHECK(r.is_object(), "report '{}' is a JSON {}, expected an object with \"schema\": \"{}\"", source, r.type_name(),
             kReportSchema);
  DUET_CHECK(r.contains("schema") && r["schema"].is_string(),
             "report '{}' has no \"schema\" string: it is not a duet profile report (expected \"schema\": \"{}\")", source,
             kReportSchema);
  const std::string schema = r["schema"].get<std::string>();
  DUET_CHECK(schema == kReportSchema,
             "report '{}' has schema '{}': this duet reads '{}' (re-run the profile with this duet, or read it with the "
             "duet that wrote it)",
             source, schema, kReportSchema);
  using vt = nlohmann::json::value_t;
  section(r, "timing_mode", vt::string, "\"per-op\" or \"throughput\"", source);
  section(r, "machine", vt::object, "an object", source);
  section(r, "run_config", vt::object, "an object", source);
  section(r, "roofline", vt::object, "an object", source);
  section(r, "totals", vt::object, "an object", source);
  section(r, "op_records", vt::array, "an array", source);
  section(r, "phases", vt::object, "an object", source);
  section(r, "steps", vt::array, "an array", source);
  section(r, "memory", vt::object, "an object", source);
  const std::string mode = r["timing_mode"].get<std::string>();
  DUET_CHECK(mode == "per-op" || mode == "throughput", "report '{}': timing_mode is '{}', expected per-op or throughput",
             source, mode);
  DUET_CHECK(member(r["totals"], "device").is_string(), "report '{}': totals.device is {}, expected a device name (\"cpu\")",
             source, member(r["totals"], "device").dump());
  for (const auto& rec : r["op_records"]) {
    try {
      (void)op_record_from_json(rec);
    } catch (const Error& e) {
      throw Error(fmt::format("report '{}': {}", source, e.what()));
    }
  }
  // Every view of the report, section by section: a field missing or of the wrong type deep
  // inside a section becomes a duet::Error naming the report and the section here, not a JSON
  // library exception from whichever view reads it first.
  PrintOptions none;
  none.ops = none.steps = none.memory = none.telemetry = false;
  const std::pair<const char*, std::function<void()>> views[] = {
      {"\"machine\", \"run_config\", \"roofline\" or \"totals\"", [&] { (void)format_header(r); }},
      {"\"op_records\"",
       [&] {
         PrintOptions p = none;
         p.ops = p.layers = true;
         (void)format_report(r, p);
         (void)report_csv(r, {});
       }},
      {"\"phases\" or \"steps\"",
       [&] {
         PrintOptions p = none;
         p.steps = p.per_step = true;
         (void)format_report(r, p);
       }},
      {"\"memory\"",
       [&] {
         PrintOptions p = none;
         p.memory = true;
         (void)format_report(r, p);
       }},
      {"\"telemetry\"",
       [&] {
         PrintOptions p = none;
         p.telemetry = true;
         (void)format_report(r, p);
       }},
  };
  for (const auto& [section, read] : views) {
    try {
      read();
    } catch (const nlohmann::json::exception& e) {
      throw Error(fmt::format("report '{}': its {} section has a field missing or of the wrong type ({}): it does not "
                              "follow {} (docs/profiler.md); re-create it with a profiled run",
                              source, section, e.what(), kReportSchema));
    }
  }
}

nlohmann::json load_report(const std::string& path) {
  const std::string text = read_file(path, "report");
  nlohmann::json r;
  try {
    r = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number beyond a double
    throw Error(fmt::format("report '{}' is not valid JSON: {} (a duet.profile/1 report is written by a profiled "
                            "`duet train` or profiler::write_report)",
                            path, e.what()));
  }
  validate_report(r, path);
  return r;
}

std::vector<OpRecord> records_of(const nlohmann::json& report) {
  std::vector<OpRecord> out;
  for (const auto& j : report.at("op_records")) out.push_back(op_record_from_json(j));
  return out;
}

TableBasis basis_of(const nlohmann::json& report) {
  const nlohmann::json& t = report.at("totals");
  TableBasis b;
  b.steps = t.value("steps", int64_t{0});
  b.basis = t.value("pct_basis", std::string("ops"));
  b.basis_ns = static_cast<double>(b.basis == "step" ? t.value("step_ns", int64_t{0}) : t.value("op_self_ns", int64_t{0}));
  return b;
}

std::optional<Ceilings> ceilings_of(const nlohmann::json& report) {
  return ceilings_from_roofline_json(report.value("roofline", nlohmann::json()));
}

std::string format_header(const nlohmann::json& r) {
  const std::string mode = r.value("timing_mode", std::string("?"));
  std::string s = fmt::format(
      "duet profile ({}), created {} | timing: {} ({})\n", r.value("schema", std::string("?")),
      r.value("created", std::string("?")), mode,
      mode == "per-op" ? "every op timed, CUDA ops by events on the stream: op times add up to the step"
                       : "end to end, no per-op events or synchronisation");
  const nlohmann::json& rc = r.at("run_config");
  if (!rc.empty()) {
    std::vector<std::string> kv;
    for (auto it = rc.begin(); it != rc.end(); ++it)
      kv.push_back(fmt::format("{}={}", it.key(), it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
    s += fmt::format("run: {}\n", fmt::join(kv, " "));
  }
  const nlohmann::json& m = r.at("machine");
  std::vector<std::string> isa;
  if (m.contains("isa"))
    for (auto it = member(m, "isa").begin(); it != member(m, "isa").end(); ++it)
      if (it.value() == true) isa.push_back(it.key());
  // "(1 usable)" only where the affinity mask or a control group's quota leaves fewer.
  const int logical = m.value("logical_cpus", 0), usable = m.value("usable_cpus", logical);
  const std::string cpus = usable > 0 && usable < logical ? fmt::format("{} logical CPUs ({} usable)", logical, usable)
                                                          : fmt::format("{} logical CPUs", logical);
  s += fmt::format("machine: {} ({}), {}, {} threads used, ISA {}, oneDNN {}", cpu_name(m),
                   m.value("hostname", std::string("?")), cpus, m.value("threads_used", 0),
                   isa.empty() ? std::string("-") : fmt::format("{}", fmt::join(isa, " ")),
                   member(m, "onednn").is_string() ? member(m, "onednn").get<std::string>() : std::string("n/a"));
  if (m.contains("usable_memory_bytes") && m["usable_memory_bytes"].is_number())
    s += fmt::format(", {:.1f} GiB memory usable", m["usable_memory_bytes"].get<double>() / (1 << 30));
  if (m.contains("cuda") && m["cuda"].is_object()) s += fmt::format(", cuda {}", m["cuda"].dump());
  if (member(m, "cpu_bf16") == "reference_loops") s += ", bf16 on the reference loops (oneDNN has no AVX-512 here)";
  if (member(m, "cpu_bf16_math") == "f32" && member(m, "cpu_bf16_dot_speedup").is_number())
    s += fmt::format(", bf16 products in f32 (bf16 dots {:.1f}x f32's)", m["cpu_bf16_dot_speedup"].get<double>());
  // The cpu backend's kernel choices, only where one differs from the default.
  if (m.contains("cpu_kernels") && m["cpu_kernels"].is_object()) {
    std::vector<std::string> changed;
    for (auto it = m["cpu_kernels"].begin(); it != m["cpu_kernels"].end(); ++it)
      if (it.value() != "automatic" && it.value() != false)
        changed.push_back(fmt::format("{}={}", it.key(), it.value().is_string() ? it.value().get<std::string>() : it.value().dump()));
    if (!changed.empty()) s += fmt::format(", cpu kernels {}", fmt::join(changed, " "));
  }
  s += "\n";
  const auto c = ceilings_of(r);
  if (c)
    s += fmt::format("roofline: {} {} threads: GEMM {} GFLOP/s{}, copy {} GB/s, ridge {} FLOP/byte (probe {}, {})\n",
                     c->device, c->threads, fmt_rate(c->gemm_gflops),
                     c->gemm_bf16_gflops > 0 ? fmt::format(" (bf16 {})", fmt_rate(c->gemm_bf16_gflops)) : std::string(),
                     fmt_rate(c->copy_gbs), fmt_rate(c->ridge()), c->probe_path, c->created);
  else
    s += fmt::format("roofline: {}\n", r.at("roofline").value("note", std::string("no probe")));
  const nlohmann::json& t = r.at("totals");
  const int64_t steps = t.value("steps", int64_t{0});
  const double step_ns = t.value("step_ns", 0.0), op_ns = t.value("op_self_ns", 0.0);
  if (steps > 0)
    s += fmt::format("steps: {} marked, {} s; ops in steps: {} ({} s, {} of step time)", steps,
                     fmt::format("{:.3f}", step_ns * 1e-9), t.value("ops", int64_t{0}), fmt::format("{:.3f}", op_ns * 1e-9),
                     fmt_pct(step_ns > 0 ? op_ns / step_ns : 0));
  else
    s += fmt::format("no steps marked: {} ops, {} s of op time (percentages are of op time)", t.value("ops", int64_t{0}),
                     fmt::format("{:.3f}", op_ns * 1e-9));
  const auto& out = t.value("ops_outside_steps", nlohmann::json::object());
  if (out.value("count", int64_t{0}) > 0)
    s += fmt::format("; {} ops ({} ms) ran outside steps and are not tabled", out.value("count", int64_t{0}),
                     fmt_ms(out.value("self_ns", 0.0)));
  return s + "\n";
}

std::string format_report(const nlohmann::json& r, const PrintOptions& o) {
  std::string s = format_header(r);
  const std::vector<OpRecord> records = records_of(r);
  const TableBasis basis = basis_of(r);
  const std::optional<Ceilings> c = o.ceilings ? o.ceilings : ceilings_of(r);
  const std::string pct = basis.basis == "step" ? "% step" : "% ops";
  const bool per_op = r.value("timing_mode", std::string()) == "per-op";
  if (o.ops) {
    s += "\n";
    if (!per_op) {
      s += "operators: none recorded (throughput mode records steps only; profile in per-op mode for op tables)\n";
    } else {
      const auto rows = op_table(records, basis, c, o.table);
      s += fmt::format("operators{} ({} timing; sorted by {}; self = total while ops do not nest)\n",
                       o.table.by_shape ? " by input shapes" : "", r.value("timing_mode", std::string("?")),
                       o.table.sort.empty() ? "self" : o.table.sort);
      s += format_op_table(rows, o.top, o.table.by_shape, pct);
    }
  }
  if (o.layers && !per_op) s += "\nlayers: none recorded (throughput mode)\n";
  if (o.layers && per_op) {
    TableOptions lo = o.table;
    const auto rows = layer_table(records, basis, c, lo);
    s += fmt::format("\nlayers ({} timing; module path and phase; backward ops carry their forward's module; sorted by {})\n",
                     r.value("timing_mode", std::string("?")), lo.sort.empty() ? "execution order" : lo.sort);
    s += format_layer_table(rows, o.top, pct);
  }
  if (o.steps) s += "\n" + format_step_breakdown(r, o.per_step);
  if (o.memory) s += "\n" + format_memory(r);
  if (o.telemetry && r.contains("telemetry") && r["telemetry"].is_object()) {
    const auto& tl = r["telemetry"];
    std::vector<std::string> parts;
    for (const auto& ch : member(tl, "channels")) {
      const std::string name = ch.value("name", std::string("?")), unit = ch.value("unit", std::string());
      const auto& sm = member(member(tl, "summary"), name);
      if (!sm.is_object()) {
        parts.push_back(name + " n/a");
        continue;
      }
      if (unit == "bytes")
        parts.push_back(fmt::format("{} mean {} max {}", name, fmt_bytes(sm.value("mean", 0.0)), fmt_bytes(sm.value("max", 0.0))));
      else
        parts.push_back(fmt::format("{} mean {}{} max {}{}", name, fmt_rate(sm.value("mean", 0.0)), unit,
                                    fmt_rate(sm.value("max", 0.0)), unit));
    }
    s += fmt::format("\ntelemetry ({} samples every {} ms): {}\n", member(tl, "samples").size(), tl.value("interval_ms", 0),
                     fmt::join(parts, "; "));
  }
  return s;
}

std::string report_csv(const nlohmann::json& r, const TableOptions& o) {
  return op_table_csv(op_table(records_of(r), basis_of(r), ceilings_of(r), o), r.value("timing_mode", std::string("?")));
}

void write_report(const nlohmann::json& report, const std::string& json_path, const std::string& csv_path) {
  validate_report(report, json_path);
  write_file_atomic(json_path, report.dump(1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  if (!csv_path.empty()) write_file_atomic(csv_path, report_csv(report, {}));
}

}  // namespace duet::profiler
