// The operator table (torch.profiler's key_averages) and the per-layer table (`caffe time`),
// both regroupings of op records. Times: self = the op minus ops nested inside it, total = the
// whole op; ops do not nest today, so the two are equal, and both are kept so a nested op would
// show up rather than be counted twice.
#pragma once
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "reports/records.h"
#include "reports/roofline.h"

namespace duet::profiler {

struct TableRow {
  std::string key;    // op name, or module path in the layer table ("(no module)" when empty)
  std::string phase;  // forward, backward, optimizer, data, copy, other
  std::string backend, shapes, impl;  // "" when the rows summed differ (impl: distinct values joined)
  std::string ops;    // layer table: the op names summed into the row, joined with '+'
  int64_t calls = 0, self_ns = 0, total_ns = 0;
  double flops = 0, bytes = 0;
  double flops_16 = 0;  // of flops, those done on 16-bit floats (held against the bf16 ceiling)
  int64_t bytes_allocated = 0;
  int64_t first_start_ns = 0;
  // Derived (fill_derived):
  double pct = 0;           // self_ns over the table's basis (step time, or all ops' time)
  double per_step_ns = 0;   // self_ns / steps (0 without steps)
  double mean_ns = 0;       // total_ns / calls
  double gflops = 0, gbs = 0, flop_per_byte = 0;  // from self time and the cost formulas
  std::string bound;        // "memory" | "compute" | "" (no probe, or no FLOPs and no bytes)
  double roof_pct = 0;      // achieved GFLOP/s over the attainable roof at this FLOP/byte (0: n/a)
};

struct TableOptions {
  bool by_shape = false;  // op table: one row per (op, phase, backend, input shapes)
  std::string sort;       // column name (see sort_columns()); "" = "self" (ops), "order" (layers)
};

struct TableBasis {
  double basis_ns = 0;       // denominator of the % column
  std::string basis = "ops"; // "step" (sum of step times) or "ops" (sum of op self times)
  int64_t steps = 0;
};

// Valid --sort values: order name phase calls self total pct mean flops gflops bytes gbs
// intensity alloc. Throws duet::Error for anything else, listing them.
const std::vector<std::string>& sort_columns();

// All rows, sorted.
std::vector<TableRow> op_table(const std::vector<OpRecord>& records, const TableBasis& basis,
                               const std::optional<Ceilings>& ceilings, const TableOptions& o);
std::vector<TableRow> layer_table(const std::vector<OpRecord>& records, const TableBasis& basis,
                                  const std::optional<Ceilings>& ceilings, const TableOptions& o);

// Text: the header, the first `top` rows (0: all), one line summing the rest when rows were cut,
// and a total line.
// `pct_label` heads the % column ("% step" or "% ops", after TableBasis::basis).
std::string format_op_table(const std::vector<TableRow>& rows, size_t top, bool by_shape, const std::string& pct_label);
std::string format_layer_table(const std::vector<TableRow>& rows, size_t top, const std::string& pct_label);
// CSV of the op table, one header line; times in ms, sizes in bytes; every row names the timing
// mode that produced it ("per-op" or "throughput").
std::string op_table_csv(const std::vector<TableRow>& rows, const std::string& timing_mode);

nlohmann::json to_json(const TableRow& r);

}  // namespace duet::profiler
