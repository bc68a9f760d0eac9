// The rank summary of a data-parallel run's reports (see ranks.h).
#include "reports/ranks.h"
#include <algorithm>
#include <fmt/format.h>
#include "engine/error.h"
#include "engine/profiler/events.h"
#include "reports/records.h"
#include "reports/steps.h"
#include "reports/text_table.h"

namespace duet::profiler {

namespace {
struct Rank {
  int64_t rank = 0;
  std::string file;
  double median_step_ns = 0;
  std::vector<double> phase_ns;  // per report_phase_order(): wall time where recorded, else op time
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}
}  // namespace

std::string format_rank_summary(const std::vector<nlohmann::json>& reports, const std::vector<std::string>& files) {
  DUET_CHECK(reports.size() == files.size() && !reports.empty(), "rank summary: {} reports for {} files", reports.size(),
             files.size());
  const auto& phases = report_phase_order();
  std::vector<Rank> ranks;
  int64_t world = -1;
  bool wall = true;
  for (size_t i = 0; i < reports.size(); ++i) {
    const nlohmann::json& rc = member(reports[i], "run_config");
    const nlohmann::json& rank = member(rc, "rank");
    const nlohmann::json& size = member(rc, "world_size");
    DUET_CHECK(rank.is_number_integer() && size.is_number_integer(),
               "report '{}' is not a rank report of a data-parallel run (its run_config has no rank and world_size); "
               "several reports are summarised by rank only when a profiled `mpirun ... duet train --profile FILE` "
               "wrote them (compare other reports with `duet compare`)",
               files[i]);
    DUET_CHECK(world < 0 || size.get<int64_t>() == world, "report '{}' is of a run on {} ranks, '{}' of one on {}",
               files[i], size.get<int64_t>(), files[0], world);
    world = size.get<int64_t>();
    const nlohmann::json& ph = member(reports[i], "phases");
    wall = wall && member(ph, "mean_wall_ns").is_object();
    ranks.push_back({rank.get<int64_t>(), files[i], member(ph, "median_step_ns").is_number() ? member(ph, "median_step_ns").get<double>() : 0.0, {}});
  }
  for (size_t i = 0; i < reports.size(); ++i) {
    const nlohmann::json& per_phase = member(member(reports[i], "phases"), wall ? "mean_wall_ns" : "mean_ops_ns");
    for (Phase p : phases) ranks[i].phase_ns.push_back(per_phase.is_object() ? per_phase.value(phase_name(p), 0.0) : 0.0);
  }
  std::sort(ranks.begin(), ranks.end(), [](const Rank& a, const Rank& b) { return a.rank < b.rank; });
  for (size_t i = 1; i < ranks.size(); ++i)
    DUET_CHECK(ranks[i].rank != ranks[i - 1].rank, "reports '{}' and '{}' are both rank {}", ranks[i - 1].file,
               ranks[i].file, ranks[i].rank);

  // Ranks move in lock step (every all-reduce waits for the last rank to join), so their steps
  // take about as long; the rank the others wait for is the one with the most time outside comm.
  const auto comm_at = static_cast<size_t>(std::find(phases.begin(), phases.end(), Phase::comm) - phases.begin());
  auto busy = [&](const Rank& r) {
    double t = 0;
    for (size_t k = 0; k < phases.size(); ++k)
      if (k != comm_at) t += r.phase_ns[k];
    return t;
  };
  std::string s = fmt::format("{} of {} ranks; per step, mean {} time by phase (ms){}\n", ranks.size(), world,
                              wall ? "wall" : "op", wall ? "" : " (per-op timing; no wall times recorded)");
  TextTable t;
  t.column("rank");
  t.column("median step");
  for (size_t k = 0; k < phases.size(); ++k) t.column(phase_name(phases[k]));
  t.column("outside comm");
  t.column("file", TextTable::left);
  for (const Rank& r : ranks) {
    std::vector<std::string> row{std::to_string(r.rank), fmt_ms(r.median_step_ns)};
    for (double v : r.phase_ns) row.push_back(fmt_ms(v));
    row.push_back(fmt_ms(busy(r)));
    row.push_back(r.file);
    t.row(std::move(row));
  }
  s += t.str("  ");
  if (ranks.size() < 2) return s;
  const Rank& slow = *std::max_element(ranks.begin(), ranks.end(), [&](const Rank& a, const Rank& b) { return busy(a) < busy(b); });
  std::vector<double> busy_all;
  for (const Rank& r : ranks) busy_all.push_back(busy(r));
  size_t worst = 0;
  double worst_excess = -1;
  for (size_t k = 0; k < phases.size(); ++k) {
    if (k == comm_at) continue;
    std::vector<double> v;
    for (const Rank& r : ranks) v.push_back(r.phase_ns[k]);
    const double excess = slow.phase_ns[k] - median(v);
    if (excess > worst_excess) worst_excess = excess, worst = k;
  }
  s += fmt::format("slowest: rank {}, {} ms a step outside comm against a median of {} ms over the ranks; the others "
                   "wait for it in comm. Most of the difference is in {} (+{} ms over the ranks' median).\n",
                   slow.rank, fmt_ms(busy(slow)), fmt_ms(median(busy_all)), phase_name(phases[worst]),
                   fmt_ms(std::max(worst_excess, 0.0)));
  return s;
}

}  // namespace duet::profiler
