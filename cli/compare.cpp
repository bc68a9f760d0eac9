// `duet compare A.json B.json ...`: profile reports side by side per phase, op and layer, with
// ratios against the first (reports/compare.h), printed and optionally written as JSON.
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/commands.h"
#include "engine/error.h"
#include "reports/compare.h"
#include "reports/files.h"
#include "train/output_check.h"

namespace duet::app {

namespace {

struct CompareCmd {
  std::vector<std::string> files;
  std::string json;
  size_t top = 25;
};

void run_compare(const CompareCmd& c, std::ostream& out) {
  DUET_CHECK(c.files.size() >= 2, "compare needs at least 2 report files, got {}", c.files.size());
  check_output_file("--json", c.json, OutputKind::creates_folders);
  const nlohmann::json cmp = profiler::compare_files(c.files);
  out << profiler::format_compare(cmp, c.top);
  if (!c.json.empty()) {
    profiler::write_file_atomic(c.json, dump_lenient(cmp, 1) + "\n");
    out << fmt::format("\ncomparison written to {}\n", c.json);
  }
}

}  // namespace

Command add_compare_command(CLI::App& app) {
  auto c = std::make_shared<CompareCmd>();
  CLI::App* cmd = app.add_subcommand("compare", "Compare 2 or more profile reports per phase, op and layer (ratios vs the first)");
  cmd->add_option("reports", c->files, "Report JSON files; the first is the baseline")->required();
  cmd->add_option("--top", c->top, "Op and layer rows to show (0: all)")->capture_default_str();
  cmd->add_option("--json", c->json, "Also write the comparison (duet.compare/1 JSON) to this file");
  return {cmd, [c](std::ostream& out) {
            run_compare(*c, out);
            return 0;
          }};
}

}  // namespace duet::app
