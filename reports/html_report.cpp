// The HTML report's page filled in (see html_report.h).
#include "reports/html_report.h"
#include <fmt/format.h>
#include "engine/error.h"
#include "reports/op_summary.h"
#include "reports/report.h"

namespace duet::profiler {

namespace html {  // reports/html/, embedded by reports/html/embed.cmake
extern const char* const kTemplate;
extern const char* const kStyle;
extern const char* const kScript;
}  // namespace html

namespace {

std::string escape_html(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// JSON for a <script> element: every '<' written as \u003c (valid JSON, same value), so no
// "</script>" or "<!--" in a name can end or change the element.
std::string script_json(const nlohmann::json& j) {
  const std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (char c : s) out += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return out;
}

// The template with each {{NAME}} replaced; only the template is scanned, never what is put in.
std::string fill(const std::string& title, const std::string& generator, const nlohmann::json& data) {
  const std::string t = html::kTemplate;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t open = t.find("{{", pos);
    if (open == std::string::npos) break;
    const size_t close = t.find("}}", open);
    DUET_CHECK(close != std::string::npos, "internal: reports/html/report.html has an unclosed {{{{");
    out.append(t, pos, open - pos);
    const std::string name = t.substr(open + 2, close - open - 2);
    if (name == "TITLE") out += escape_html(title);
    else if (name == "GENERATOR") out += escape_html(generator);
    else if (name == "STYLE") out += html::kStyle;
    else if (name == "SCRIPT") out += html::kScript;
    else if (name == "DATA") out += script_json(data);
    else throw Error(fmt::format("internal: reports/html/report.html names an unknown field {{{{{}}}}}", name));
    pos = close + 2;
  }
  return out + t.substr(pos);
}

nlohmann::json rows_json(const std::vector<TableRow>& rows) {
  nlohmann::json a = nlohmann::json::array();
  for (const TableRow& r : rows) a.push_back(to_json(r));
  return a;
}

// What the page draws of a report: the report without its op records and telemetry samples, the
// op and layer tables made from the records (as `duet report` prints them), per-step memory only
// for the curve.
nlohmann::json page_report(const nlohmann::json& r, const std::optional<Ceilings>& ceilings) {
  nlohmann::json p = r;
  const std::optional<Ceilings> c = ceilings ? ceilings : ceilings_of(r);
  const std::vector<OpRecord> records = records_of(r);
  const bool per_op = r.value("timing_mode", std::string()) == "per-op";
  p["op_table"] = per_op ? rows_json(op_table(records, basis_of(r), c, {})) : nlohmann::json::array();
  p["layer_table"] = per_op ? rows_json(layer_table(records, basis_of(r), c, {})) : nlohmann::json::array();
  if (ceilings) p["roofline"] = roofline_json(ceilings, "");
  p.erase("op_records");
  if (p.contains("telemetry") && p["telemetry"].is_object()) p["telemetry"].erase("samples");
  for (auto& s : p["steps"])
    for (auto& m : s["memory"]) m = {{"device", m["device"]}, {"current", m["current"]}, {"peak", m["peak"]}};
  return p;
}

std::string title_of(const nlohmann::json& r) {
  const nlohmann::json& rc = r["run_config"];
  const auto str = [&](const char* k) {
    return rc.contains(k) ? (rc[k].is_string() ? rc[k].get<std::string>() : rc[k].dump()) : std::string("?");
  };
  return fmt::format("{} batch {} on {}", str("model"), str("batch"), r["totals"].value("device", std::string("?")));
}

}  // namespace

std::string report_html(const nlohmann::json& report, const std::string& name, const std::optional<Ceilings>& ceilings) {
  const nlohmann::json data = {{"kind", "report"}, {"name", name}, {"report", page_report(report, ceilings)}};
  return fill(fmt::format("duet profile: {} ({})", title_of(report), name), "duet report " + name, data);
}

std::string compare_html(const nlohmann::json& cmp, const std::vector<NamedReport>& reports) {
  nlohmann::json runs = nlohmann::json::array();
  std::string names;
  for (const NamedReport& r : reports) {
    nlohmann::json devices = nlohmann::json::array();
    for (const auto& d : r.report["memory"]["devices"])
      devices.push_back({{"device", d["device"]}, {"peak", d["peak"]}, {"peak_op", d.value("peak_op", nlohmann::json())}});
    runs.push_back({{"name", r.name},
                    {"totals", r.report["totals"]},
                    {"phases", r.report["phases"]},
                    {"memory", {{"devices", devices}}}});
    names += (names.empty() ? "" : " ") + r.name;
  }
  const nlohmann::json data = {{"kind", "compare"}, {"compare", cmp}, {"runs", runs}};
  return fill(fmt::format("duet compare: {} runs ({})", reports.size(), title_of(reports.front().report)),
              "duet compare " + names, data);
}

}  // namespace duet::profiler
