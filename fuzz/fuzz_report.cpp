// A profile report as `duet report` and `duet compare` read it: parsed, validated, printed, and
// compared with itself.
#include <nlohmann/json.hpp>
#include "reports/compare.h"
#include "reports/report.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = duet::fuzz::input_file(data, size, ".json");
  duet::fuzz::expect_only_duet_errors([&] {
    const nlohmann::json r = duet::profiler::load_report(path);
    duet::profiler::PrintOptions p;
    (void)duet::profiler::format_report(r, p);
    (void)duet::profiler::format_compare(duet::profiler::compare({{"a", r}, {"b", r}}));
  });
  return 0;
}
