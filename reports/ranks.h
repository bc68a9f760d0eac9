// The rank reports of one data-parallel run side by side (`duet report run.json run.rank1.json ...`):
// which rank the others wait for, and in which phase it spends the time.
#pragma once
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

namespace duet::profiler {

// `reports[i]` was read from `files[i]`; each must be one rank's report of the same data-parallel
// run (run_config "rank" and "world_size", written by a profiled `mpirun ... duet train`), or a
// duet::Error names the file and what is missing.
std::string format_rank_summary(const std::vector<nlohmann::json>& reports, const std::vector<std::string>& files);

}  // namespace duet::profiler
