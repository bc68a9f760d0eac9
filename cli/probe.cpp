// `duet probe`: measures this machine's roofline ceilings (fp32 and bf16 GEMM GFLOP/s, copy GB/s
// per thread count) through reports/probe.h and saves them where reports of this machine find them.
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/commands.h"
#include "cli/global_options.h"
#include "engine/backend.h"
#include "reports/probe.h"
#include "reports/sweep.h"
#include "train/output_check.h"
#include "train/run_env.h"

namespace duet::app {

namespace {

struct ProbeCmd {
  GlobalOptions* global = nullptr;  // --device, --backend and --threads pick what is probed
  profiler::ProbeOptions o;
  std::string threads, out;
  bool no_save = false;
};

void run_probe(ProbeCmd& c, std::ostream& out) {
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

}  // namespace

Command add_probe_command(CLI::App& app, GlobalOptions& global) {
  auto c = std::make_shared<ProbeCmd>();
  c->global = &global;
  CLI::App* cmd = app.add_subcommand("probe", "Measure this machine's ceilings (fp32 and bf16 GEMM GFLOP/s, copy GB/s per thread count) "
                                              "for the profiler's roofline");
  cmd->add_option("--size", c->o.gemm_size, "Square GEMM size n (n x n times n x n)")->capture_default_str();
  cmd->add_option("--copy-mib", c->o.copy_mib, "Size of each copy buffer in MiB")->capture_default_str();
  cmd->add_option("--repeats", c->o.repeats, "Timed runs per measurement (the best is kept)")->capture_default_str();
  cmd->add_option("--out", c->out, "Probe file to write (default: ~/.cache/duet/probe-<host>-<cpu hash>.json)");
  cmd->add_flag("--no-save", c->no_save, "Print only; write no probe file");
  add_global_options(*cmd, global);
  cmd->add_option("--thread-counts", c->threads, "CPU thread counts to measure, e.g. 1,2 (default: 1 .. --threads)");
  return {cmd, [c](std::ostream& out) {
            run_probe(*c, out);
            return 0;
          }};
}

}  // namespace duet::app
