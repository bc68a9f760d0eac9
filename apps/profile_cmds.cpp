#include "apps/profile_cmds.h"
#include <omp.h>
#include "apps/output_check.h"
#include "apps/run_env.h"
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "engine/error.h"
#include "engine/profiler/capture.h"
#include "reports/compare.h"
#include "reports/files.h"
#include "engine/profiler/machine.h"
#include "reports/probe.h"
#include "reports/ranks.h"
#include "reports/report.h"
#include "engine/profiler/session.h"
#include "engine/profiler/telemetry.h"
#include "reports/trace.h"
#ifdef DUET_HAVE_CUDA
#include "backends/cuda/nvml_telemetry.h"
#endif

namespace duet::app {

namespace {

struct ProbeCmd {
  CLI::App* cmd = nullptr;
  GlobalOptions* global = nullptr;  // --device, --backend and --threads pick what is probed
  profiler::ProbeOptions o;
  std::string threads, out;
  bool no_save = false;
};
struct ReportCmd {
  CLI::App* cmd = nullptr;
  std::vector<std::string> files;
  std::string sort, csv, probe;
  size_t top = 20;
  bool by_shape = false, layers = false, per_step = false;
};
struct CompareCmd {
  CLI::App* cmd = nullptr;
  std::vector<std::string> files;
  std::string json;
  size_t top = 25;
};
ProbeCmd& probe_cmd() {
  static ProbeCmd c;
  return c;
}
ReportCmd& report_cmd() {
  static ReportCmd c;
  return c;
}
CompareCmd& compare_cmd() {
  static CompareCmd c;
  return c;
}

std::string csv_path_for(const std::string& json_path) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() && json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
    return json_path.substr(0, json_path.size() - ext.size()) + ".ops.csv";
  return json_path + ".ops.csv";
}

void run_probe_cmd(std::ostream& out) {
  ProbeCmd& c = probe_cmd();
  if (c.global) {
    const RunEnv env = apply_global_options(*c.global);  // sets the backend and OpenMP's thread count
    c.o.device = env.device.str();
    c.o.backend = backend_name(env.backend);
  }
  if (!c.threads.empty())
    for (int64_t t : profiler::parse_batch_list(c.threads)) c.o.threads.push_back(static_cast<int>(t));
  if (!c.no_save) check_output_file("--out", c.out, OutputKind::creates_folders);  // before the minute of measuring
  if (c.o.backend == "reference" && c.o.gemm_size > 512)
    out << fmt::format("note: the reference backend's plain-loop GEMM at {0}x{0} takes long; --size 512 is quicker\n",
                       c.o.gemm_size);
  const profiler::ProbeResult r = profiler::run_probe(c.o);
  out << profiler::format_probe(r);
  if (c.no_save) return;
  const std::string path = c.out.empty() ? profiler::default_probe_path(r.machine) : c.out;
  profiler::save_probe(r, path);
  out << fmt::format("saved to {} (reports of this machine use it for the roofline)\n", path);
}

void run_report_cmd(std::ostream& out) {
  ReportCmd& c = report_cmd();
  check_output_file("--csv", c.csv, OutputKind::creates_folders);
  if (c.files.size() > 1) {  // the rank reports of one data-parallel run
    DUET_CHECK(c.csv.empty() && c.probe.empty(), "--csv and --probe are for one report; {} were given", c.files.size());
    std::vector<nlohmann::json> reports;
    for (const std::string& f : c.files) reports.push_back(profiler::load_report(f));
    out << profiler::format_rank_summary(reports, c.files);
    return;
  }
  const nlohmann::json r = profiler::load_report(c.files.front());
  profiler::PrintOptions p;
  p.table.by_shape = c.by_shape;
  p.table.sort = c.sort;
  p.top = c.top;
  p.layers = c.layers;
  p.per_step = c.per_step;
  if (!c.probe.empty()) {
    std::string why;
    p.ceilings = profiler::find_ceilings(r["machine"], r["totals"].value("device", std::string("cpu")),
                                         r["machine"].value("threads_used", 0), c.probe, &why);
    if (!p.ceilings) out << why << "\n";
  }
  out << profiler::format_report(r, p);
  if (!c.csv.empty()) {
    profiler::TableOptions t = p.table;
    profiler::write_file_atomic(c.csv, profiler::report_csv(r, t));
    out << fmt::format("\nop table written to {}\n", c.csv);
  }
}

void run_compare_cmd(std::ostream& out) {
  CompareCmd& c = compare_cmd();
  DUET_CHECK(c.files.size() >= 2, "compare needs at least 2 report files, got {}", c.files.size());
  check_output_file("--json", c.json, OutputKind::creates_folders);
  const nlohmann::json cmp = profiler::compare_files(c.files);
  out << profiler::format_compare(cmp, c.top);
  if (!c.json.empty()) {
    profiler::write_file_atomic(c.json, dump_lenient(cmp, 1) + "\n");
    out << fmt::format("\ncomparison written to {}\n", c.json);
  }
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

namespace {
ProbeCmd& add_probe_subcommand(CLI::App& app) {
  ProbeCmd& c = probe_cmd();
  c.cmd = app.add_subcommand("probe", "Measure this machine's ceilings (fp32 and bf16 GEMM GFLOP/s, copy GB/s per thread count) "
                                      "for the profiler's roofline");
  c.cmd->add_option("--size", c.o.gemm_size, "Square GEMM size n (n x n times n x n)")->capture_default_str();
  c.cmd->add_option("--copy-mib", c.o.copy_mib, "Size of each copy buffer in MiB")->capture_default_str();
  c.cmd->add_option("--repeats", c.o.repeats, "Timed runs per measurement (the best is kept)")->capture_default_str();
  c.cmd->add_option("--out", c.out, "Probe file to write (default: ~/.cache/duet/probe-<host>-<cpu hash>.json)");
  c.cmd->add_flag("--no-save", c.no_save, "Print only; write no probe file");
  return c;
}
}  // namespace

void add_probe_command(CLI::App& app, GlobalOptions& global) {
  ProbeCmd& c = add_probe_subcommand(app);
  c.global = &global;
  add_global_options(*c.cmd, global);
  c.cmd->add_option("--thread-counts", c.threads, "CPU thread counts to measure, e.g. 1,2 (default: 1 .. --threads)");
}

void add_report_command(CLI::App& app) {
  ReportCmd& c = report_cmd();
  c.cmd = app.add_subcommand("report", "Print the tables of a saved profile report (duet.profile/1 JSON)");
  c.cmd->add_option("reports", c.files,
                    "Report JSON file; several: the rank reports of one data-parallel run (run.json run.rank1.json ...), "
                    "summarised by rank with the slowest named")
      ->required();
  c.cmd->add_option("--sort", c.sort,
                    "Sort column: order name phase calls self total pct mean flops gflops bytes gbs intensity alloc "
                    "(default: self for ops, order for layers)");
  c.cmd->add_option("--top", c.top, "Rows to show (0: all)")->capture_default_str();
  c.cmd->add_flag("--group-by-shape", c.by_shape, "One row per op and input shapes");
  c.cmd->add_flag("--layers", c.layers, "Also print the per-layer table (module path x phase)");
  c.cmd->add_flag("--steps", c.per_step, "Also print one line per step");
  c.cmd->add_option("--csv", c.csv, "Write the op table (as grouped and sorted) to this CSV file");
  c.cmd->add_option("--probe", c.probe, "Use this probe file for the roofline instead of the report's own");
}

void add_compare_command(CLI::App& app) {
  CompareCmd& c = compare_cmd();
  c.cmd = app.add_subcommand("compare", "Compare 2 or more profile reports per phase, op and layer (ratios vs the first)");
  c.cmd->add_option("reports", c.files, "Report JSON files; the first is the baseline")->required();
  c.cmd->add_option("--top", c.top, "Op and layer rows to show (0: all)")->capture_default_str();
  c.cmd->add_option("--json", c.json, "Also write the comparison (duet.compare/1 JSON) to this file");
}

bool run_profile_commands(std::ostream& out) {
  if (probe_cmd().cmd && probe_cmd().cmd->parsed()) run_probe_cmd(out);
  else if (report_cmd().cmd && report_cmd().cmd->parsed()) run_report_cmd(out);
  else if (compare_cmd().cmd && compare_cmd().cmd->parsed()) run_compare_cmd(out);
  else return false;
  return true;
}

void finish_profile(const nlohmann::json& run_config, const std::string& json_path, const std::string& trace_path,
                    std::ostream& out) {
  profiler::stop_session();  // idempotent: recording must be off before the capture
  const profiler::Capture cap = profiler::capture();
  present_profile(profiler::build_report(cap, run_config), cap, json_path, trace_path, out);
}

std::string rank_report_path(const std::string& json_path, int rank) {
  const std::string ext = ".json";
  if (json_path.size() > ext.size() && json_path.compare(json_path.size() - ext.size(), ext.size(), ext) == 0)
    return fmt::format("{}.rank{}.json", json_path.substr(0, json_path.size() - ext.size()), rank);
  return fmt::format("{}.rank{}", json_path, rank);
}

void finish_profile_on_ranks(dist::Communicator& comm, nlohmann::json run_config, const std::string& json_path,
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
  if (comm.rank() != 0) return;
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

void finish_sweep(const nlohmann::json& run_config, const std::vector<profiler::SweepPoint>& points,
                  const std::string& json_path, std::ostream& out) {
  out << "\nthroughput by batch size\n" << profiler::format_sweep_table(points);
  if (!json_path.empty()) {
    profiler::write_file_atomic(json_path, profiler::sweep_json(run_config, points).dump(1) + "\n");
    out << fmt::format("sweep written to {} (plot: scripts/plot_profile.py --sweep {})\n", json_path, json_path);
  }
}

}  // namespace duet::app
