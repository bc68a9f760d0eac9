// The HTML report: one self-contained page per profile report (`duet report RUN.json --html
// out.html`) or comparison (`duet compare A.json B.json --html out.html`) that opens offline. The
// page is reports/html/ (a template, its style sheet and its script, embedded in the binary at
// build time) with the data embedded as JSON; the script draws the step breakdown, the op table
// with implementations and roof fractions, the memory curve with the peak op, the roofline against
// the report's probed ceilings and the per-layer table (for a comparison: the runs side by side
// with ratios), as plain SVG and sortable tables.
#pragma once
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "reports/compare.h"
#include "reports/roofline.h"

namespace duet::profiler {

// The page of one report (validated by load_report or validate_report); `name` heads it.
// `ceilings` replace the report's own roofline (duet report --probe).
std::string report_html(const nlohmann::json& report, const std::string& name,
                        const std::optional<Ceilings>& ceilings = std::nullopt);
// The page of a comparison (the result of compare(reports)) and the reports it compared.
std::string compare_html(const nlohmann::json& cmp, const std::vector<NamedReport>& reports);

}  // namespace duet::profiler
