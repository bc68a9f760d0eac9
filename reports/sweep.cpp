// Batch-size sweep points, their table and their JSON document (see sweep.h).
#include "reports/sweep.h"
#include <charconv>
#include <fmt/format.h>
#include "engine/error.h"
#include "reports/records.h"
#include "reports/text_table.h"

namespace duet::profiler {

std::vector<int64_t> parse_batch_list(const std::string& s) {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t end = s.find(',', start);
    const std::string item = s.substr(start, end == std::string::npos ? std::string::npos : end - start);
    int64_t v = 0;
    const auto [p, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    DUET_CHECK(!item.empty() && ec == std::errc() && p == item.data() + item.size() && v > 0,
               "batch list '{}': item '{}' is not a positive integer (expected e.g. 16,32,64)", s, item);
    out.push_back(v);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

SweepPoint sweep_point_from_report(int64_t batch, const nlohmann::json& r) {
  SweepPoint p;
  p.batch = batch;
  const auto& ph = r.at("phases");
  p.steps = ph.value("steps", int64_t{0});
  if (member(ph, "images_per_s").is_number()) p.images_per_s = member(ph, "images_per_s").get<double>();
  if (p.steps > 0) p.median_step_ms = ph.value("median_step_ns", 0.0) * 1e-6;
  const std::string dev = r.at("totals").value("device", std::string("cpu"));
  for (const auto& d : r.at("memory").at("devices"))
    if (d.value("device", std::string()) == dev) p.peak_bytes = d.value("peak", int64_t{0});
  p.timing_mode = r.value("timing_mode", std::string());
  return p;
}

namespace {
template <class T>
nlohmann::json opt(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}
}  // namespace

nlohmann::json sweep_json(const nlohmann::json& run_config, const std::vector<SweepPoint>& points) {
  nlohmann::json pts = nlohmann::json::array();
  for (const SweepPoint& p : points)
    pts.push_back({{"batch", p.batch},
                   {"steps", p.steps},
                   {"images_per_s", opt(p.images_per_s)},
                   {"median_step_ms", opt(p.median_step_ms)},
                   {"peak_bytes", opt(p.peak_bytes)},
                   {"timing_mode", p.timing_mode},
                   {"error", p.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.error)},
                   {"report", p.report_path.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.report_path)}});
  return {{"schema", "duet.sweep/1"}, {"run_config", run_config.is_object() ? run_config : nlohmann::json::object()},
          {"points", pts}};
}

std::vector<SweepPoint> sweep_points_from_json(const nlohmann::json& j) {
  DUET_CHECK(member(j, "schema") == "duet.sweep/1", "not a sweep document: expected \"schema\": \"duet.sweep/1\"");
  DUET_CHECK(member(j, "points").is_array(), "sweep document lacks its \"points\" array");
  std::vector<SweepPoint> out;
  for (const auto& q : j["points"]) {
    DUET_CHECK(q.is_object(), "sweep document: point {} is a JSON {}, expected an object", out.size(), q.type_name());
    SweepPoint p;
    DUET_CHECK(is_int64(member(q, "batch")) && is_int64(member(q, "steps")),
               "sweep document: point {} lacks an integer \"batch\" or \"steps\"", out.size());
    p.batch = q["batch"].get<int64_t>();
    p.steps = q["steps"].get<int64_t>();
    if (member(q, "images_per_s").is_number()) p.images_per_s = member(q, "images_per_s").get<double>();
    if (member(q, "median_step_ms").is_number()) p.median_step_ms = member(q, "median_step_ms").get<double>();
    if (is_int64(member(q, "peak_bytes"))) p.peak_bytes = member(q, "peak_bytes").get<int64_t>();
    if (member(q, "timing_mode").is_string()) p.timing_mode = q["timing_mode"].get<std::string>();
    if (member(q, "error").is_string()) p.error = member(q, "error").get<std::string>();
    if (member(q, "report").is_string()) p.report_path = member(q, "report").get<std::string>();
    out.push_back(p);
  }
  return out;
}

std::string format_sweep_table(const std::vector<SweepPoint>& points) {
  TextTable t;
  t.column("batch");
  t.column("images/s");
  t.column("vs first");
  t.column("median step ms");
  t.column("ms/image");
  t.column("peak MiB");
  t.column("timing", TextTable::left);
  t.column("status", TextTable::left);
  std::optional<double> first;
  for (const SweepPoint& p : points) {
    if (!first && p.images_per_s) first = p.images_per_s;
    t.row({std::to_string(p.batch), p.images_per_s ? fmt_rate(*p.images_per_s) : "-",
           p.images_per_s && first ? fmt::format("{:.2f}x", *p.images_per_s / *first) : "-",
           p.median_step_ms ? fmt::format("{:.2f}", *p.median_step_ms) : "-",
           p.median_step_ms ? fmt::format("{:.3f}", *p.median_step_ms / static_cast<double>(p.batch)) : "-",
           p.peak_bytes ? fmt_mib(static_cast<double>(*p.peak_bytes)) : "-", p.timing_mode,
           p.error.empty() ? "ok" : p.error});
  }
  return t.str("  ");
}

}  // namespace duet::profiler
