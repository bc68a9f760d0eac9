// The raw per-op totals table of `duet train --profile`: profiler events summed by (op, phase)
// and sorted by total time, with achieved GFLOP/s and GB/s from the ops' cost formulas.
#pragma once
#include <string>
#include <vector>
#include "engine/profiler.h"

namespace duet::app {

struct OpTotal {
  std::string name;
  Phase phase = Phase::other;
  int64_t calls = 0;
  int64_t ns = 0;
  double flops = 0, bytes = 0;
};

// Sums events by (name, phase); sorted by total time, longest first.
std::vector<OpTotal> op_totals(const std::vector<OpEvent>& events);
// A fixed-width text table; max_rows 0 prints every row (the rest are summed into one line).
std::string format_op_table(const std::vector<OpTotal>& totals, size_t max_rows = 0);

}  // namespace duet::app
