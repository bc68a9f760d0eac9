// The start and end of a profiled run (see profiling.h).
#include "train/profiling.h"
#include <ostream>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "engine/profiler/telemetry.h"
#include "reports/files.h"
#include "reports/report.h"
#include "reports/trace.h"
#include "train/output_check.h"
#ifdef DUET_HAVE_CUDA
#include "backends/cuda/nvml_telemetry.h"
#endif

namespace duet::app {

namespace {

std::string csv_path_for(const std::string& json_path) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() && json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
    return json_path.substr(0, json_path.size() - ext.size()) + ".ops.csv";
  return json_path + ".ops.csv";
}

#ifdef DUET_HAVE_CUDA
// NVML readings of one GPU as telemetry channels "gpu<N>.<what>"; absent readings stay absent.
class NvmlSource final : public profiler::TelemetrySource {
public:
  explicit NvmlSource(int device) : device_(device) {}
  std::string name() const override { return "nvml"; }
  std::vector<profiler::Reading> read() override {
    const cuda::GpuTelemetry t = cuda::sample_telemetry(device_);
    auto opt = [](const auto& v) { return v ? std::optional<double>(static_cast<double>(*v)) : std::nullopt; };
    const std::string p = fmt::format("gpu{}.", device_);
    return {{p + "util_pct", "%", opt(t.utilization_pct)},
            {p + "memory_util_pct", "%", opt(t.memory_utilization_pct)},
            {p + "memory_used_bytes", "bytes", opt(t.memory_used_bytes)},
            {p + "temperature_c", "C", opt(t.temperature_c)},
            {p + "power_w", "W", opt(t.power_w)},
            {p + "sm_clock_mhz", "MHz", opt(t.sm_clock_mhz)}};
  }

private:
  int device_;
};
#endif

}  // namespace

void start_profile(const profiler::SessionOptions& o) {
#ifdef DUET_HAVE_CUDA
  if (o.device.type == DeviceType::cuda) {
    const int index = o.device.index;
    profiler::register_telemetry_source("nvml", [index] { return std::make_unique<NvmlSource>(index); });
  }
#endif
  profiler::start_session(o);
}

nlohmann::json finish_profile(const nlohmann::json& run_config, const std::string& json_path,
                              const std::string& trace_path, std::ostream& out) {
  profiler::stop_session();  // idempotent: recording must be off before the capture
  const profiler::Capture cap = profiler::capture();
  nlohmann::json report = profiler::build_report(cap, run_config);
  present_profile(report, cap, json_path, trace_path, out);
  return report;
}

std::string rank_report_path(const std::string& json_path, int rank) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() && json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
    return fmt::format("{}.rank{}.json", json_path.substr(0, json_path.size() - ext.size()), rank);
  return fmt::format("{}.rank{}", json_path, rank);
}

nlohmann::json finish_profile_on_ranks(dist::Communicator& comm, nlohmann::json run_config, const std::string& json_path,
                                      const std::string& trace_path, int64_t t0_ns, std::ostream& out) {
  profiler::stop_session();
  const profiler::Capture cap = profiler::capture();
  run_config["rank"] = comm.rank();
  run_config["world_size"] = comm.size();
  const nlohmann::json report = profiler::build_report(cap, run_config);
  // Only what will be written travels: a rank's report when there is a report file, its trace
  // when there is a trace file.
  const std::vector<std::string> reports = comm.gather(json_path.empty() ? "" : dump_lenient(report), 0);
  const std::string host = report["machine"].value("hostname", std::string());
  const profiler::TraceProcess process{.pid = comm.rank() + 1,
                                       .name = fmt::format("rank {}{}", comm.rank(), host.empty() ? "" : " (" + host + ")"),
                                       .t0_ns = t0_ns};
  const std::vector<std::string> traces =
      comm.gather(trace_path.empty() ? "" : profiler::trace_text(profiler::chrome_trace(cap, report["run_config"], process)), 0);
  if (comm.rank() != 0) return report;
  present_profile(report, cap, json_path, "", out);
  if (!json_path.empty()) {
    std::vector<std::string> written{json_path};
    for (int r = 1; r < comm.size(); ++r) {
      const std::string path = rank_report_path(json_path, r);
      profiler::write_report(nlohmann::json::parse(reports[static_cast<size_t>(r)]), path, csv_path_for(path));
      written.push_back(path);
    }
    out << fmt::format("rank reports: {}; `duet report` of them all names the slowest rank and why\n",
                       fmt::join(written, " "));
  }
  if (!trace_path.empty()) {
    std::vector<nlohmann::json> all;
    for (const std::string& t : traces) all.push_back(nlohmann::json::parse(t));
    profiler::write_file_atomic(trace_path, profiler::trace_text(profiler::merge_chrome_traces(all)));
    out << fmt::format("trace: {}, one process track per rank (open in https://ui.perfetto.dev)\n", trace_path);
  }
  return report;
}

void present_profile(const nlohmann::json& report, const profiler::Capture& cap, const std::string& json_path,
                     const std::string& trace_path, std::ostream& out) {
  profiler::PrintOptions p;
  p.top = 20;
  out << "\n" << profiler::format_report(report, p);
  if (!json_path.empty()) {
    const std::string csv = csv_path_for(json_path);
    profiler::write_report(report, json_path, csv);
    out << fmt::format("\nprofile report: {} (op table as CSV: {}); print it again with `duet report {}`\n", json_path,
                       csv, json_path);
  }
  if (!trace_path.empty()) {
    profiler::write_chrome_trace(cap, trace_path, report.value("run_config", nlohmann::json::object()));
    out << fmt::format("trace: {} (open in https://ui.perfetto.dev or chrome://tracing)\n", trace_path);
  }
}

}  // namespace duet::app
