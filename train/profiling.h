// The start and end of a profiled run (`duet train --profile`, `duet profile`): the GPU telemetry
// source, then the report's tables printed and its files written (the JSON report with its op
// table as CSV beside it, the Chrome trace), on one rank or gathered from every rank.
#pragma once
#include <iosfwd>
#include <string>
#include <nlohmann/json.hpp>
#include "distributed/communicator.h"
#include "engine/profiler/capture.h"
#include "engine/profiler/session.h"

namespace duet::app {

// The start of a profiled run: registers the GPU telemetry source (NVML) when the CUDA backend
// is built in, then profiler::start_session(o). The trainer marks steps with
// profiler::step_begin(step, batch, device) / step_end() and ends with finish_profile.
void start_profile(const profiler::SessionOptions& o);

// The end of a profiled run: stops the session, prints the operator table (top 20
// by self time), the step breakdown and the memory summary, and writes the JSON report (plus its
// op table as CSV beside it, <name>.ops.csv) and the Chrome trace. An empty path skips that file.
// Returns the report.
nlohmann::json finish_profile(const nlohmann::json& run_config, const std::string& json_path, const std::string& trace_path,
                    std::ostream& out);
// The end of a profiled data-parallel run, on every rank at once: each rank builds its report
// (run_config gains "rank" and "world_size") and its trace (a process track "rank r", time from
// `t0_ns`, each rank's clock at the end of one barrier at the start), and rank 0 gathers them: it
// prints and writes its own report as finish_profile does, the other ranks' beside it as
// <name>.rank<r>.json (rank_report_path), and one trace holding every rank's track. Returns this
// rank's report.
nlohmann::json finish_profile_on_ranks(dist::Communicator& comm, nlohmann::json run_config, const std::string& json_path,
                             const std::string& trace_path, int64_t t0_ns, std::ostream& out);
// "run.json" -> "run.rank2.json": where rank r's report of a data-parallel run is written.
std::string rank_report_path(const std::string& json_path, int rank);
// The printing and writing half of finish_profile, for a report already built from `cap`.
void present_profile(const nlohmann::json& report, const profiler::Capture& cap, const std::string& json_path,
                     const std::string& trace_path, std::ostream& out);

}  // namespace duet::app
