// `duet compare` (see compare.h): reports lined up per phase, op and layer, with ratios to the first.
#include "reports/compare.h"
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <fmt/format.h>
#include "engine/error.h"
#include "reports/records.h"
#include "reports/report.h"
#include "reports/steps.h"
#include "reports/text_table.h"

namespace duet::profiler {

namespace {
// A number field of a report section, 0 when the section or the field is missing or not a
// number. (operator[] of a const json on a missing key is undefined behaviour: fuzz_report found a
// use-after-free through it with a report whose "phases" lacked "images_per_s".)
double number(const nlohmann::json& section, const char* key) {
  const nlohmann::json& v = member(section, key);
  return v.is_number() ? v.get<double>() : 0.0;
}


std::string model_of(const nlohmann::json& r) {
  const auto& rc = r.at("run_config");
  return rc.contains("model") && rc["model"].is_string() ? rc["model"].get<std::string>() : std::string();
}

// `known[i]` is false for a report that has no such number (op times of a throughput report):
// its value and ratio are null, never a misleading 0.
nlohmann::json values(const std::vector<double>& v, const std::vector<bool>& known) {
  nlohmann::json a = nlohmann::json::array();
  for (size_t i = 0; i < v.size(); ++i) a.push_back(known[i] ? nlohmann::json(v[i]) : nlohmann::json(nullptr));
  return a;
}
nlohmann::json ratios(const std::vector<double>& v, const std::vector<bool>& known) {
  nlohmann::json a = nlohmann::json::array();
  for (size_t i = 0; i < v.size(); ++i)
    a.push_back(known[0] && known[i] && v[0] > 0 ? nlohmann::json(v[i] / v[0]) : nlohmann::json(nullptr));
  return a;
}

struct Row {
  std::vector<double> value;  // ms per step (or total ms)
  std::vector<double> share;  // fraction of the report's basis
  double order = 0;
};

// Sums self time by key per report; values in ms per step when every report has steps.
template <class KeyFn>
std::vector<std::pair<std::pair<std::string, std::string>, Row>> rows_by(const std::vector<NamedReport>& rs, bool per_step,
                                                                         KeyFn key) {
  std::map<std::pair<std::string, std::string>, Row> m;
  for (size_t i = 0; i < rs.size(); ++i) {
    const TableBasis b = basis_of(rs[i].report);
    const double div = per_step && b.steps > 0 ? static_cast<double>(b.steps) : 1.0;
    for (const OpRecord& r : records_of(rs[i].report)) {
      Row& row = m[key(r)];
      row.value.resize(rs.size());
      row.share.resize(rs.size());
      row.value[i] += static_cast<double>(r.self_ns) * 1e-6 / div;
      row.share[i] += b.basis_ns > 0 ? static_cast<double>(r.self_ns) / b.basis_ns : 0;
      if (i == 0 && (row.order == 0 || static_cast<double>(r.first_start_ns) < row.order))
        row.order = static_cast<double>(r.first_start_ns);
    }
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> v(m.begin(), m.end());
  for (auto& [k, row] : v) {
    row.value.resize(rs.size());
    row.share.resize(rs.size());
  }
  return v;
}

nlohmann::json row_json(const std::string& key_name, const std::string& key, const std::string& phase, const Row& r,
                        const std::vector<bool>& known) {
  return {{key_name, key},
          {"phase", phase},
          {"value", values(r.value, known)},
          {"ratio", ratios(r.value, known)},
          {"share", values(r.share, known)}};
}

nlohmann::json compare_valid(const std::vector<NamedReport>& rs) {
  nlohmann::json out;
  out["schema"] = "duet.compare/1";
  nlohmann::json warnings = nlohmann::json::array(), notes = nlohmann::json::array();

  std::set<std::string> models, modes, batches;
  bool all_steps = true;
  nlohmann::json reports = nlohmann::json::array();
  for (const NamedReport& r : rs) {
    const std::string model = model_of(r.report);
    models.insert(model);
    modes.insert(r.report["timing_mode"].get<std::string>());
    const auto& rc = r.report["run_config"];
    if (rc.contains("batch")) batches.insert(rc["batch"].dump());
    if (basis_of(r.report).steps == 0) all_steps = false;
    reports.push_back({{"name", r.name},
                       {"model", model.empty() ? nlohmann::json(nullptr) : nlohmann::json(model)},
                       {"timing_mode", r.report["timing_mode"]},
                       {"run_config", rc},
                       {"cpu_model", r.report["machine"].value("cpu_model", std::string("?"))}});
  }
  out["reports"] = reports;
  std::vector<bool> has_ops, all(rs.size(), true);
  for (const NamedReport& r : rs) has_ops.push_back(r.report["timing_mode"] == "per-op");
  const bool same_model = models.size() == 1 && !models.begin()->empty();
  if (models.size() > 1) {
    std::vector<std::string> ms;
    for (const NamedReport& r : rs) ms.push_back(model_of(r.report).empty() ? "(unknown)" : model_of(r.report));
    warnings.push_back(fmt::format(
        "the reports are of different models ({}): ops and phases are compared, the per-layer comparison is skipped",
        fmt::join(ms, " vs ")));
  } else if (!same_model) {
    warnings.push_back("the reports name no model (run_config.model): the per-layer comparison assumes the same network");
  }
  if (modes.size() > 1)
    warnings.push_back("the reports mix timing modes (per-op and throughput): throughput reports have no op times, and "
                       "step times of per-op runs include per-op synchronisation");
  if (batches.size() > 1)
    notes.push_back("batch sizes differ: times per step grow with the batch; compare images/s and shares of step time");
  if (!all_steps) notes.push_back("a report has no marked steps: op times are totals (ms), not ms per step");
  out["per_step"] = all_steps;

  // Phases: ms per step (ops and wall), the step, images/s.
  nlohmann::json phases = nlohmann::json::array();
  auto add_phase = [&](const std::string& label, auto get, const std::vector<bool>& known) {
    std::vector<double> v;
    for (const NamedReport& r : rs) v.push_back(get(r.report));
    phases.push_back({{"phase", label}, {"value", values(v, known)}, {"ratio", ratios(v, known)}});
  };
  for (Phase p : report_phase_order()) {
    const char* name = phase_name(p);
    bool any = false;
    for (const NamedReport& r : rs) any = any || member(r.report["phases"], "mean_ops_ns").value(name, 0.0) > 0;
    if (any) add_phase(std::string(name) + " (ops)", [&](const nlohmann::json& r) {
      return number(member(member(r, "phases"), "mean_ops_ns"), name) * 1e-6;
    }, has_ops);
  }
  add_phase("untracked", [](const nlohmann::json& r) { return number(member(r, "phases"), "mean_untracked_ns") * 1e-6; },
            has_ops);
  // Wall time per phase exists in both timing modes: the rows that compare per-op with throughput.
  bool all_wall = true;
  for (const NamedReport& r : rs) all_wall = all_wall && member(r.report["phases"], "mean_wall_ns").is_object();
  if (all_wall)
    for (Phase p : report_phase_order()) {
      const char* name = phase_name(p);
      bool any = false;
      for (const NamedReport& r : rs) any = any || member(r.report["phases"], "mean_wall_ns").value(name, 0.0) > 0;
      if (any) add_phase(std::string(name) + " (wall)", [&](const nlohmann::json& r) {
        return number(member(member(r, "phases"), "mean_wall_ns"), name) * 1e-6;
      }, all);
    }
  add_phase("step", [](const nlohmann::json& r) { return number(member(r, "phases"), "mean_step_ns") * 1e-6; }, all);
  std::vector<bool> has_ips;
  for (const NamedReport& r : rs) has_ips.push_back(member(r.report["phases"], "images_per_s").is_number());
  add_phase("images/s", [](const nlohmann::json& r) {
    return number(member(r, "phases"), "images_per_s");
  }, has_ips);
  out["phases"] = phases;

  // Ops by (name, phase).
  auto ops = rows_by(rs, all_steps, [](const OpRecord& r) { return std::pair{r.name, r.phase}; });
  std::stable_sort(ops.begin(), ops.end(), [](const auto& a, const auto& b) { return a.second.value[0] > b.second.value[0]; });
  nlohmann::json op_rows = nlohmann::json::array();
  for (const auto& [k, row] : ops) op_rows.push_back(row_json("op", k.first, k.second, row, has_ops));
  out["ops"] = op_rows;

  // Share shifts: the largest change (in percentage points) of any report against the first.
  std::vector<std::pair<double, nlohmann::json>> shifts;
  for (const auto& [k, row] : ops) {
    double best = 0;
    nlohmann::json delta = nlohmann::json::array();
    for (size_t i = 0; i < rs.size(); ++i) {
      if (!has_ops[0] || !has_ops[i]) {
        delta.push_back(nullptr);
        continue;
      }
      const double d = 100.0 * (row.share[i] - row.share[0]);
      delta.push_back(d);
      if (std::fabs(d) > std::fabs(best)) best = d;
    }
    shifts.emplace_back(std::fabs(best), nlohmann::json{{"op", k.first}, {"phase", k.second},
                                                        {"share", values(row.share, has_ops)}, {"delta_pp", delta}});
  }
  std::stable_sort(shifts.begin(), shifts.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  nlohmann::json shift_rows = nlohmann::json::array();
  for (auto& [mag, j] : shifts)
    if (mag > 0) shift_rows.push_back(j);
  out["share_shifts"] = shift_rows;

  if (same_model || models.size() == 1) {
    auto layers = rows_by(rs, all_steps, [](const OpRecord& r) {
      return std::pair{r.scope.empty() ? std::string("(no module)") : r.scope, r.phase};
    });
    std::stable_sort(layers.begin(), layers.end(), [](const auto& a, const auto& b) { return a.second.order < b.second.order; });
    nlohmann::json lr = nlohmann::json::array();
    for (const auto& [k, row] : layers) lr.push_back(row_json("layer", k.first, k.second, row, has_ops));
    out["layers"] = lr;
  } else {
    out["layers"] = nullptr;
    notes.push_back("per-layer comparison skipped: the models differ, so their module paths do not correspond");
  }
  out["warnings"] = warnings;
  out["notes"] = notes;
  return out;
}
}  // namespace

nlohmann::json compare(const std::vector<NamedReport>& rs) {
  DUET_CHECK(rs.size() >= 2, "compare needs at least 2 reports, got {}", rs.size());
  for (const NamedReport& r : rs) validate_report(r.report, r.name);
  try {
    return compare_valid(rs);
  } catch (const nlohmann::json::exception& e) {  // validate_report reads what the views read; compare reads a little more
    std::vector<std::string> names;
    for (const NamedReport& r : rs) names.push_back("'" + r.name + "'");
    throw Error(fmt::format("compare: one of the reports {} has a field missing or of the wrong type ({}): it does not "
                            "follow duet.profile/1 (docs/profiler.md)",
                            fmt::join(names, ", "), e.what()));
  }
}

nlohmann::json compare_files(const std::vector<std::string>& paths) {
  DUET_CHECK(paths.size() >= 2, "compare needs at least 2 report files, got {}", paths.size());
  std::vector<NamedReport> rs;
  for (const std::string& p : paths) rs.push_back({p, load_report(p)});
  return compare(rs);
}

namespace {
std::string ratio_str(const nlohmann::json& r) { return r.is_number() ? fmt::format("{:.2f}x", r.get<double>()) : "-"; }

std::string table(const nlohmann::json& rows, const std::vector<std::string>& names, const char* key_name,
                  const std::string& unit, size_t top, bool with_phase) {
  TextTable t;
  t.column(key_name, TextTable::left);
  if (with_phase) t.column("phase", TextTable::left);
  for (size_t i = 0; i < names.size(); ++i) {
    t.column(fmt::format("[{}] {}", i, unit));
    if (i > 0) t.column(fmt::format("[{}]/[0]", i));
  }
  size_t n = 0;
  for (const auto& r : rows) {
    if (top > 0 && n++ >= top) break;
    std::vector<std::string> c{r.value(key_name, r.value("phase", std::string()))};
    if (with_phase) c.push_back(r.value("phase", std::string()));
    for (size_t i = 0; i < names.size(); ++i) {
      c.push_back(r["value"][i].is_number() ? fmt_rate(r["value"][i].get<double>()) : "-");
      if (i > 0) c.push_back(ratio_str(r["ratio"][i]));
    }
    t.row(c);
  }
  std::string s = t.str("  ");
  if (top > 0 && rows.size() > top) s += fmt::format("  ({} more rows)\n", rows.size() - top);
  return s;
}
}  // namespace

std::string format_compare(const nlohmann::json& cmp, size_t top) {
  std::string s;
  std::vector<std::string> names;
  for (const auto& r : cmp.at("reports")) names.push_back(r.value("name", std::string("?")));
  for (const auto& w : cmp.at("warnings")) s += "WARNING: " + w.get<std::string>() + "\n";
  for (size_t i = 0; i < names.size(); ++i) {
    const auto& r = cmp["reports"][i];
    s += fmt::format("[{}] {}: model {}, timing {}, {}\n", i, names[i],
                     r["model"].is_string() ? r["model"].get<std::string>() : "(unknown)",
                     r.value("timing_mode", std::string("?")), r["run_config"].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  }
  for (const auto& n : cmp.at("notes")) s += "note: " + n.get<std::string>() + "\n";
  const bool per_step = cmp.value("per_step", false);
  const std::string unit = per_step ? "ms/step" : "ms";
  s += "\nphases (mean per step; images/s in its own unit)\n";
  s += table(cmp["phases"], names, "phase", "value", 0, false);
  s += fmt::format("\nops (self time, {}; sorted by [0])\n", unit);
  s += table(cmp["ops"], names, "op", unit, top, true);
  s += "\nshare of step time that moved most (percentage points vs [0])\n";
  if (cmp["share_shifts"].empty()) {
    s += "  (no op's share changed, or only one report has op times)\n";
  } else {
    TextTable t;
    t.column("op", TextTable::left);
    t.column("phase", TextTable::left);
    for (size_t i = 0; i < names.size(); ++i) {
      t.column(fmt::format("[{}] share", i));
      if (i > 0) t.column(fmt::format("[{}] change", i));
    }
    size_t n = 0;
    for (const auto& r : cmp["share_shifts"]) {
      if (n++ >= (top > 0 ? std::min<size_t>(top, 10) : 10)) break;
      std::vector<std::string> c{r.value("op", std::string()), r.value("phase", std::string())};
      for (size_t i = 0; i < names.size(); ++i) {
        c.push_back(r["share"][i].is_number() ? fmt_pct(r["share"][i].get<double>()) : "-");
        if (i > 0)
          c.push_back(r["delta_pp"][i].is_number() ? fmt::format("{:+.1f} pp", r["delta_pp"][i].get<double>()) : "-");
      }
      t.row(c);
    }
    s += t.str("  ");
  }
  if (cmp["layers"].is_array()) {
    s += fmt::format("\nlayers (self time, {}; execution order)\n", unit);
    s += table(cmp["layers"], names, "layer", unit, top, true);
  } else {
    s += "\nlayers: skipped (different models)\n";
  }
  return s;
}

}  // namespace duet::profiler
