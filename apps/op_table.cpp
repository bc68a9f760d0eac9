#include "apps/op_table.h"
#include <algorithm>
#include <map>
#include <fmt/format.h>

namespace duet::app {

std::vector<OpTotal> op_totals(const std::vector<OpEvent>& events) {
  std::map<std::pair<std::string, Phase>, OpTotal> by_key;
  for (const OpEvent& e : events) {
    OpTotal& t = by_key[{e.name, e.phase}];
    t.name = e.name;
    t.phase = e.phase;
    t.calls++;
    t.ns += e.end_ns - e.start_ns;
    t.flops += e.flops;
    t.bytes += e.bytes;
  }
  std::vector<OpTotal> out;
  for (auto& [k, t] : by_key) out.push_back(std::move(t));
  std::stable_sort(out.begin(), out.end(), [](const OpTotal& a, const OpTotal& b) { return a.ns > b.ns; });
  return out;
}

namespace {
// FLOP/ns is GFLOP/s and byte/ns is GB/s.
std::string rate(double amount, int64_t ns) {
  if (amount <= 0 || ns <= 0) return "-";
  return fmt::format("{:.2f}", amount / static_cast<double>(ns));
}

// `phase` is empty on summary rows, where the ops of several phases are mixed.
std::string row(const OpTotal& t, double total_ns, const char* phase) {
  return fmt::format("{:<32} {:<9} {:>7} {:>11.2f} {:>6.1f}% {:>9} {:>8}\n", t.name, phase, t.calls,
                     static_cast<double>(t.ns) * 1e-6, total_ns > 0 ? 100.0 * static_cast<double>(t.ns) / total_ns : 0.0,
                     rate(t.flops, t.ns), rate(t.bytes, t.ns));
}
}  // namespace

std::string format_op_table(const std::vector<OpTotal>& totals, size_t max_rows) {
  double total_ns = 0;
  OpTotal all{"total", Phase::other, 0, 0, 0, 0};
  for (const OpTotal& t : totals) {
    total_ns += static_cast<double>(t.ns);
    all.calls += t.calls;
    all.ns += t.ns;
    all.flops += t.flops;
    all.bytes += t.bytes;
  }
  std::string s = fmt::format("{:<32} {:<9} {:>7} {:>11} {:>7} {:>9} {:>8}\n", "op", "phase", "calls", "total ms",
                              "%", "GFLOP/s", "GB/s");
  s += std::string(89, '-') + "\n";
  const size_t shown = max_rows == 0 ? totals.size() : std::min(max_rows, totals.size());
  for (size_t i = 0; i < shown; ++i) s += row(totals[i], total_ns, phase_name(totals[i].phase));
  if (shown < totals.size()) {
    OpTotal rest{fmt::format("({} more ops)", totals.size() - shown), Phase::other, 0, 0, 0, 0};
    for (size_t i = shown; i < totals.size(); ++i) {
      rest.calls += totals[i].calls;
      rest.ns += totals[i].ns;
      rest.flops += totals[i].flops;
      rest.bytes += totals[i].bytes;
    }
    s += row(rest, total_ns, "");
  }
  s += std::string(89, '-') + "\n";
  s += row(all, total_ns, "");
  return s;
}

}  // namespace duet::app
