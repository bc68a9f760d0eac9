// `duet compare A.json B.json ...`: profile reports side by side per phase, op and layer, with
// ratios against the first (reports/compare.h), printed and optionally written as JSON.
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/commands.h"
#include "engine/error.h"
#include "reports/compare.h"
#include "reports/files.h"
#include "reports/html_report.h"
#include "reports/report.h"
#include "train/output_check.h"

namespace duet::app {

namespace {

struct CompareCmd {
  std::vector<std::string> files;
  std::string json, html;
  size_t top = 25;
};

void run_compare(const CompareCmd& c, std::ostream& out) {
  DUET_CHECK(c.files.size() >= 2, "compare needs at least 2 report files, got {}", c.files.size());
  check_output_file("--json", c.json, OutputKind::creates_folders);
  check_output_file("--html", c.html);  // into an existing folder: a typo fails before anything is read
  std::vector<profiler::NamedReport> reports;
  for (const std::string& f : c.files) reports.push_back({f, profiler::load_report(f)});
  const nlohmann::json cmp = profiler::compare(reports);
  out << profiler::format_compare(cmp, c.top);
  if (!c.json.empty()) {
    profiler::write_file_atomic(c.json, dump_lenient(cmp, 1) + "\n");
    out << fmt::format("\ncomparison written to {}\n", c.json);
  }
  if (!c.html.empty()) {
    const std::string page = profiler::compare_html(cmp, reports);
    profiler::write_file_atomic(c.html, page);
    out << fmt::format("\nHTML comparison written to {} ({:.0f} KiB; opens offline in any browser)\n", c.html,
                       static_cast<double>(page.size()) / 1024.0);
  }
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto c = std::make_shared<CompareCmd>();
  CLI::App* cmd = app.add_subcommand("compare", "Compare 2 or more profile reports per phase, op and layer (ratios vs the first)");
  cmd->add_option("reports", c->files, "Report JSON files; the first is the baseline")->required();
  cmd->add_option("--top", c->top, "Op and layer rows to show (0: all)")->capture_default_str();
  cmd->add_option("--json", c->json, "Also write the comparison (duet.compare/1 JSON) to this file");
  cmd->add_option("--html", c->html, "Also write the comparison as one self-contained HTML page (runs side by side, ratios, "
                                     "sortable tables; offline) to this file");
  return {cmd, [c](std::ostream& out) {
            run_compare(*c, out);
            return 0;
          }};
}

}  // namespace duet::app
