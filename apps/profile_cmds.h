// The profiler's sub-commands of `duet`: probe (measure this machine's roofline ceilings), report
// (print the tables of a saved profile), compare (runs side by side), and what a profiled
// training run calls at its end (finish_profile) or after a batch-size sweep (finish_sweep).
#pragma once
#include <iosfwd>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "distributed/communicator.h"
#include "engine/profiler/capture.h"
#include "engine/profiler/session.h"
#include "reports/sweep.h"

namespace CLI {
class App;
}

namespace duet::app {

struct GlobalOptions;  // apps/run_env.h

// Each registers its sub-command (and its options, kept in this file) on `app`.
// probe with the global options: --device / --backend pick what is probed and --threads the
// largest thread count measured (1 .. N), whether given before or after `probe`.
void add_probe_command(CLI::App& app, GlobalOptions& global);
void add_compare_command(CLI::App& app);
void add_report_command(CLI::App& app);
// After app.parse(): runs whichever of probe / compare / report was given and returns true, or
// returns false when none was. Errors are duet::Error (main prints them), never exit() calls.
bool run_profile_commands(std::ostream& out);

// The start of a profiled run: registers the GPU telemetry source (NVML) when the CUDA backend
// is built in, then profiler::start_session(o). The trainer marks steps with
// profiler::step_begin(step, batch, device) / step_end() and ends with finish_profile.
void start_profile(const profiler::SessionOptions& o);

// The end of a profiled run: stops the session, prints the operator table (top 20
// by self time), the step breakdown and the memory summary, and writes the JSON report (plus its
// op table as CSV beside it, <name>.ops.csv) and the Chrome trace. An empty path skips that file.
void finish_profile(const nlohmann::json& run_config, const std::string& json_path, const std::string& trace_path,
                    std::ostream& out);
// The end of a profiled data-parallel run, on every rank at once: each rank builds its report
// (run_config gains "rank" and "world_size") and its trace (a process track "rank r", time from
// `t0_ns`, each rank's clock at the end of one barrier at the start), and rank 0 gathers them: it
// prints and writes its own report as finish_profile does, the other ranks' beside it as
// <name>.rank<r>.json (rank_report_path), and one trace holding every rank's track.
void finish_profile_on_ranks(dist::Communicator& comm, nlohmann::json run_config, const std::string& json_path,
                             const std::string& trace_path, int64_t t0_ns, std::ostream& out);
// "run.json" -> "run.rank2.json": where rank r's report of a data-parallel run is written.
std::string rank_report_path(const std::string& json_path, int rank);
// The printing and writing half of finish_profile, for a report already built from `cap`.
void present_profile(const nlohmann::json& report, const profiler::Capture& cap, const std::string& json_path,
                     const std::string& trace_path, std::ostream& out);

// The end of `duet profile --batch 16,32,...`: prints the sweep table and writes the sweep JSON
// (schema duet.sweep/1) when json_path is not empty.
void finish_sweep(const nlohmann::json& run_config, const std::vector<profiler::SweepPoint>& points,
                  const std::string& json_path, std::ostream& out);

}  // namespace duet::app
