// The operator and per-layer tables of a report (see op_summary.h): grouping, sorting, text and CSV.
// (Not the op test table: that is opcheck/op_table.cpp.)
#include "reports/op_summary.h"
#include <algorithm>
#include <map>
#include <tuple>
#include <fmt/format.h>
#include "engine/error.h"
#include "reports/text_table.h"

namespace duet::profiler {

const std::vector<std::string>& sort_columns() {
  static const std::vector<std::string> c{"order", "name",  "phase", "calls", "self",      "total", "pct",
                                          "mean",  "flops", "gflops", "bytes", "gbs", "intensity", "alloc"};
  return c;
}

namespace {

int phase_rank(const std::string& p) {
  static const std::vector<std::string> order{"data", "copy", "forward", "backward", "optimizer", "comm", "other"};
  const auto it = std::find(order.begin(), order.end(), p);
  return static_cast<int>(it - order.begin());
}

void merge_text(std::string& into, const std::string& v, bool first) {
  if (first) into = v;
  else if (into != v) into.clear();
}

// Appends v to a sep-joined list unless present; past max_items the list ends in "...". The
// separator must not occur in the items: implementation names hold commas ("pointwise, 64 rows").
void add_distinct(std::string& list, const std::string& v, const std::string& sep, size_t max_items) {
  if (v.empty()) return;
  std::vector<std::string> items;
  for (size_t start = 0; !list.empty();) {
    const size_t end = list.find(sep, start);
    items.push_back(list.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + sep.size();
  }
  if (std::find(items.begin(), items.end(), v) != items.end() || (!items.empty() && items.back() == "...")) return;
  if (items.size() >= max_items) list += sep + "...";
  else list += list.empty() ? v : sep + v;
}

void add_record(TableRow& row, const OpRecord& r, bool first) {
  if (first) row.first_start_ns = r.first_start_ns;
  row.first_start_ns = std::min(row.first_start_ns, r.first_start_ns);
  merge_text(row.backend, r.backend, first);
  merge_text(row.shapes, r.shapes, first);
  add_distinct(row.impl, r.impl, " | ", 3);
  add_distinct(row.ops, r.name, "+", 4);
  row.calls += r.calls;
  row.self_ns += r.self_ns;
  row.total_ns += r.total_ns;
  row.flops += r.flops;
  if (r.dtype == "bf16" || r.dtype == "f16") row.flops_16 += r.flops;
  row.bytes += r.bytes;
  row.bytes_allocated += r.bytes_allocated;
}

void fill_derived(TableRow& r, const TableBasis& b, const std::optional<Ceilings>& c) {
  r.pct = b.basis_ns > 0 ? static_cast<double>(r.self_ns) / b.basis_ns : 0;
  r.per_step_ns = b.steps > 0 ? static_cast<double>(r.self_ns) / static_cast<double>(b.steps) : 0;
  r.mean_ns = r.calls > 0 ? static_cast<double>(r.total_ns) / static_cast<double>(r.calls) : 0;
  const double t = static_cast<double>(r.self_ns);
  r.gflops = t > 0 ? r.flops / t : 0;  // FLOP per ns is GFLOP/s
  r.gbs = t > 0 ? r.bytes / t : 0;
  r.flop_per_byte = r.bytes > 0 ? r.flops / r.bytes : 0;
  r.bound = bound_of(r.flops, r.bytes, c, r.flops_16);
  r.roof_pct = 0;
  // The least time the op could take at the roof, over the time it took.
  if (c && !r.bound.empty() && t > 0)
    r.roof_pct = std::max(c->compute_ns(r.flops, r.flops_16), c->memory_ns(r.bytes)) / t;
}

void sort_rows(std::vector<TableRow>& rows, const std::string& col) {
  const auto& cols = sort_columns();
  DUET_CHECK(std::find(cols.begin(), cols.end(), col) != cols.end(), "unknown sort column '{}': expected one of {}", col,
             fmt::join(cols, ", "));
  auto num = [&](const TableRow& r) -> double {
    if (col == "calls") return static_cast<double>(r.calls);
    if (col == "self" || col == "pct") return static_cast<double>(r.self_ns);
    if (col == "total") return static_cast<double>(r.total_ns);
    if (col == "mean") return r.mean_ns;
    if (col == "flops") return r.flops;
    if (col == "gflops") return r.gflops;
    if (col == "bytes") return r.bytes;
    if (col == "gbs") return r.gbs;
    if (col == "intensity") return r.flop_per_byte;
    if (col == "alloc") return static_cast<double>(r.bytes_allocated);
    return 0;
  };
  std::stable_sort(rows.begin(), rows.end(), [&](const TableRow& a, const TableRow& b) {
    if (col == "order") return a.first_start_ns < b.first_start_ns;
    if (col == "name") return std::tie(a.key, a.phase, a.shapes) < std::tie(b.key, b.phase, b.shapes);
    if (col == "phase") {
      const int pa = phase_rank(a.phase), pb = phase_rank(b.phase);
      if (pa != pb) return pa < pb;
      return a.self_ns > b.self_ns;
    }
    const double x = num(a), y = num(b);
    if (x != y) return x > y;
    return a.key < b.key;
  });
}

template <class KeyFn>
std::vector<TableRow> group(const std::vector<OpRecord>& records, KeyFn key_of, const TableBasis& b,
                            const std::optional<Ceilings>& c) {
  std::map<std::string, size_t> index;
  std::vector<TableRow> rows;
  for (const OpRecord& r : records) {
    auto [k, key, phase] = key_of(r);
    auto [it, inserted] = index.try_emplace(k, rows.size());
    if (inserted) {
      rows.emplace_back();
      rows.back().key = key;
      rows.back().phase = phase;
    }
    add_record(rows[it->second], r, inserted);
  }
  for (TableRow& r : rows) fill_derived(r, b, c);
  return rows;
}

TableRow total_of(const std::vector<TableRow>& rows, size_t from, size_t to, const std::string& label) {
  TableRow t;
  t.key = label;
  for (size_t i = from; i < to && i < rows.size(); ++i) {
    const TableRow& r = rows[i];
    t.calls += r.calls;
    t.self_ns += r.self_ns;
    t.total_ns += r.total_ns;
    t.flops += r.flops;
    t.bytes += r.bytes;
    t.bytes_allocated += r.bytes_allocated;
    t.pct += r.pct;
    t.per_step_ns += r.per_step_ns;
  }
  const double s = static_cast<double>(t.self_ns);
  t.gflops = s > 0 ? t.flops / s : 0;
  t.gbs = s > 0 ? t.bytes / s : 0;
  t.flop_per_byte = t.bytes > 0 ? t.flops / t.bytes : 0;
  t.mean_ns = t.calls > 0 ? static_cast<double>(t.total_ns) / static_cast<double>(t.calls) : 0;
  return t;
}

std::string opt_rate(double v, bool has) { return has ? fmt_rate(v) : std::string("-"); }

}  // namespace

std::vector<TableRow> op_table(const std::vector<OpRecord>& records, const TableBasis& basis,
                               const std::optional<Ceilings>& ceilings, const TableOptions& o) {
  auto rows = group(
      records,
      [&](const OpRecord& r) {
        std::string k = r.name + '\x1f' + r.phase + '\x1f' + r.backend;
        if (o.by_shape) k += '\x1f' + r.shapes;
        return std::tuple{k, r.name, r.phase};
      },
      basis, ceilings);
  sort_rows(rows, o.sort.empty() ? "self" : o.sort);
  return rows;
}

std::vector<TableRow> layer_table(const std::vector<OpRecord>& records, const TableBasis& basis,
                                  const std::optional<Ceilings>& ceilings, const TableOptions& o) {
  auto rows = group(
      records,
      [&](const OpRecord& r) {
        const std::string scope = r.scope.empty() ? "(no module)" : r.scope;
        return std::tuple{scope + '\x1f' + r.phase, scope, r.phase};
      },
      basis, ceilings);
  sort_rows(rows, o.sort.empty() ? "order" : o.sort);
  return rows;
}

std::string format_op_table(const std::vector<TableRow>& rows, size_t top, bool by_shape, const std::string& pct_label) {
  TextTable t;
  t.column("op", TextTable::left);
  t.column("phase", TextTable::left);
  t.column("backend", TextTable::left);
  if (by_shape) t.column("input shapes", TextTable::left);
  for (const char* h : {"calls", "self ms", "total ms"}) t.column(h);
  t.column(pct_label);
  for (const char* h : {"mean us", "GFLOP", "GFLOP/s", "MB", "GB/s", "FLOP/B"}) t.column(h);
  t.column("bound", TextTable::left);
  t.column("roof");
  t.column("alloc MiB");
  if (by_shape) t.column("impl", TextTable::left);
  auto add = [&](const TableRow& r, bool total) {
    std::vector<std::string> c{r.key, r.phase, r.backend};
    if (by_shape) c.push_back(r.shapes);
    const bool has_f = r.flops > 0, has_b = r.bytes > 0;
    c.insert(c.end(), {std::to_string(r.calls), fmt_ms(static_cast<double>(r.self_ns)), fmt_ms(static_cast<double>(r.total_ns)),
                       fmt_pct(r.pct), fmt_us(r.mean_ns), opt_rate(r.flops * 1e-9, has_f), opt_rate(r.gflops, has_f),
                       opt_rate(r.bytes * 1e-6, has_b), opt_rate(r.gbs, has_b),
                       opt_rate(r.flop_per_byte, has_f && has_b), total ? "" : r.bound,
                       r.roof_pct > 0 && !total ? fmt_pct(r.roof_pct) : "",
                       fmt_mib(static_cast<double>(r.bytes_allocated))});
    if (by_shape) c.push_back(r.impl);
    t.row(std::move(c));
  };
  // A "1 more rows" line would take the place of the row itself: show it instead.
  const size_t shown = top == 0 || top + 1 >= rows.size() ? rows.size() : top;
  for (size_t i = 0; i < shown; ++i) add(rows[i], false);
  if (shown < rows.size()) add(total_of(rows, shown, rows.size(), fmt::format("({} more rows)", rows.size() - shown)), true);
  t.rule();
  add(total_of(rows, 0, rows.size(), "total"), true);
  return t.str("  ");
}

std::string format_layer_table(const std::vector<TableRow>& rows, size_t top, const std::string& pct_label) {
  TextTable t;
  t.column("layer", TextTable::left);
  t.column("phase", TextTable::left);
  t.column("ops", TextTable::left);
  for (const char* h : {"calls", "ms/step", "self ms"}) t.column(h);
  t.column(pct_label);
  for (const char* h : {"GFLOP/s", "GB/s"}) t.column(h);
  t.column("bound", TextTable::left);
  t.column("alloc MiB");
  auto add = [&](const TableRow& r, bool total) {
    t.row({r.key, r.phase, r.ops, std::to_string(r.calls), fmt_ms(r.per_step_ns), fmt_ms(static_cast<double>(r.self_ns)),
           fmt_pct(r.pct), opt_rate(r.gflops, r.flops > 0), opt_rate(r.gbs, r.bytes > 0), total ? "" : r.bound,
           fmt_mib(static_cast<double>(r.bytes_allocated))});
  };
  // A "1 more rows" line would take the place of the row itself: show it instead.
  const size_t shown = top == 0 || top + 1 >= rows.size() ? rows.size() : top;
  for (size_t i = 0; i < shown; ++i) add(rows[i], false);
  if (shown < rows.size()) add(total_of(rows, shown, rows.size(), fmt::format("({} more rows)", rows.size() - shown)), true);
  t.rule();
  add(total_of(rows, 0, rows.size(), "total"), true);
  return t.str("  ");
}

std::string op_table_csv(const std::vector<TableRow>& rows, const std::string& timing_mode) {
  std::string s =
      "op,phase,backend,shapes,calls,self_ms,total_ms,pct,mean_us,flops,gflops_per_s,bytes,gb_per_s,flop_per_byte,"
      "bound,roof_pct,bytes_allocated,impl,timing_mode\n";
  for (const TableRow& r : rows)
    s += fmt::format("{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.3f},{:.0f},{:.4f},{:.0f},{:.4f},{:.4f},{},{:.4f},{},{},{}\n",
                     csv_field(r.key), r.phase, r.backend, csv_field(r.shapes), r.calls, static_cast<double>(r.self_ns) * 1e-6,
                     static_cast<double>(r.total_ns) * 1e-6, 100.0 * r.pct, r.mean_ns * 1e-3, r.flops, r.gflops, r.bytes,
                     r.gbs, r.flop_per_byte, r.bound, 100.0 * r.roof_pct, r.bytes_allocated, csv_field(r.impl),
                     timing_mode);
  return s;
}

nlohmann::json to_json(const TableRow& r) {
  nlohmann::json j = {{"key", r.key},           {"phase", r.phase},         {"backend", r.backend},
                      {"shapes", r.shapes},     {"impl", r.impl},           {"ops", r.ops},
                      {"calls", r.calls},       {"self_ns", r.self_ns},     {"total_ns", r.total_ns},
                      {"pct", r.pct},           {"per_step_ns", r.per_step_ns}, {"mean_ns", r.mean_ns},
                      {"flops", r.flops},       {"gflops", r.gflops},       {"bytes", r.bytes},
                      {"gbs", r.gbs},           {"flop_per_byte", r.flop_per_byte},
                      {"bound", r.bound.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.bound)},
                      {"roof_pct", r.roof_pct > 0 ? nlohmann::json(r.roof_pct) : nlohmann::json(nullptr)},
                      {"bytes_allocated", r.bytes_allocated}};
  return j;
}

}  // namespace duet::profiler
