// Fixed-width text tables and unit formatting (see text_table.h).
#include "reports/text_table.h"
#include <algorithm>
#include <cmath>
#include <fmt/format.h>

namespace duet::profiler {

void TextTable::column(std::string header, Align a) {
  headers_.push_back(std::move(header));
  aligns_.push_back(a);
}

void TextTable::row(std::vector<std::string> cells) {
  cells.resize(headers_.size());
  rows_.push_back(std::move(cells));
}

void TextTable::rule() { rows_.emplace_back(); }

std::string TextTable::str(const std::string& indent) const {
  std::vector<size_t> w(headers_.size());
  for (size_t c = 0; c < headers_.size(); ++c) {
    w[c] = headers_[c].size();
    for (const auto& r : rows_)
      if (!r.empty()) w[c] = std::max(w[c], r[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s = indent;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c) s += "  ";
      const std::string& v = cells[c];
      const std::string pad(w[c] - std::min(w[c], v.size()), ' ');
      // The last left-aligned column is not padded: no trailing blanks.
      if (aligns_[c] == left) s += c + 1 == cells.size() ? v : v + pad;
      else s += pad + v;
    }
    while (!s.empty() && s.back() == ' ') s.pop_back();
    return s + "\n";
  };
  size_t total = 0;
  for (size_t c = 0; c < w.size(); ++c) total += w[c] + (c ? 2 : 0);
  std::string out = line(headers_);
  for (const auto& r : rows_) out += r.empty() ? indent + std::string(total, '-') + "\n" : line(r);
  return out;
}

std::string fmt_ms(double ns) { return fmt::format("{:.3f}", ns * 1e-6); }
std::string fmt_us(double ns) { return fmt::format("{:.1f}", ns * 1e-3); }
std::string fmt_pct(double f) { return fmt::format("{:.1f}%", 100.0 * f); }
std::string fmt_rate(double v) {
  if (!std::isfinite(v)) return "-";
  const double a = std::fabs(v);
  if (a == 0) return "0";
  if (a < 10) return fmt::format("{:.2f}", v);
  if (a < 100) return fmt::format("{:.1f}", v);
  return fmt::format("{:.0f}", v);
}
std::string fmt_mib(double bytes) { return fmt::format("{:.1f}", bytes / (1024.0 * 1024.0)); }
std::string fmt_bytes(double b) {
  const double a = std::fabs(b);
  if (a >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
  if (a >= 1024.0 * 1024) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  if (a >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}
std::string fmt_opt(const std::optional<double>& v, const char* unit) {
  return v ? fmt::format("{}{}", fmt_rate(*v), unit) : std::string("n/a");
}
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

}  // namespace duet::profiler
