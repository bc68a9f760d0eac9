// `duet report FILE`: the tables of a saved profile report (duet.profile/1) printed again, sorted,
// grouped or as CSV; several files: the rank reports of one data-parallel run, slowest rank named.
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/commands.h"
#include "engine/error.h"
#include "reports/files.h"
#include "reports/html_report.h"
#include "reports/probe.h"
#include "reports/ranks.h"
#include "reports/report.h"
#include "train/output_check.h"

namespace duet::app {

namespace {

struct ReportCmd {
  std::vector<std::string> files;
  std::string sort, csv, probe, html;
  size_t top = 20;
  bool by_shape = false, layers = false, per_step = false;
};

void run_report(const ReportCmd& c, std::ostream& out) {
  check_output_file("--csv", c.csv, OutputKind::creates_folders);
  check_output_file("--html", c.html);  // into an existing folder: a typo fails before anything is read
  if (c.files.size() > 1) {  // the rank reports of one data-parallel run
    DUET_CHECK(c.csv.empty() && c.probe.empty() && c.html.empty(), "--csv, --probe and --html are for one report; {} were given",
               c.files.size());
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
  if (!c.html.empty()) {
    const std::string page = profiler::report_html(r, c.files.front(), p.ceilings);
    profiler::write_file_atomic(c.html, page);
    out << fmt::format("\nHTML report written to {} ({:.0f} KiB; opens offline in any browser)\n", c.html,
                       static_cast<double>(page.size()) / 1024.0);
  }
}

}  // namespace

Command add_report_command(CLI::App& app) {
  auto c = std::make_shared<ReportCmd>();
  CLI::App* cmd = app.add_subcommand("report", "Print the tables of a saved profile report (duet.profile/1 JSON)");
  cmd->add_option("reports", c->files,
                 "Report JSON file; several: the rank reports of one data-parallel run (run.json run.rank1.json ...), "
                 "summarised by rank with the slowest named")
      ->required();
  cmd->add_option("--sort", c->sort,
                 "Sort column: order name phase calls self total pct mean flops gflops bytes gbs intensity alloc "
                 "(default: self for ops, order for layers)");
  cmd->add_option("--top", c->top, "Rows to show (0: all)")->capture_default_str();
  cmd->add_flag("--group-by-shape", c->by_shape, "One row per op and input shapes");
  cmd->add_flag("--layers", c->layers, "Also print the per-layer table (module path x phase)");
  cmd->add_flag("--steps", c->per_step, "Also print one line per step");
  cmd->add_option("--csv", c->csv, "Write the op table (as grouped and sorted) to this CSV file");
  cmd->add_option("--probe", c->probe, "Use this probe file for the roofline instead of the report's own");
  cmd->add_option("--html", c->html,
                  "Also write the report as one self-contained HTML page (step breakdown, op table, memory curve, "
                  "roofline, layers; sortable, offline) to this file");
  return {cmd, [c](std::ostream& out) {
            run_report(*c, out);
            return 0;
          }};
}

}  // namespace duet::app
