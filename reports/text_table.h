// Fixed-width text tables and the unit formatting every profiler table shares (ms, MB, GFLOP/s),
// so the numbers of one report line up the same way everywhere.
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace duet::profiler {

class TextTable {
public:
  enum Align { left, right };
  void column(std::string header, Align a = right);
  void row(std::vector<std::string> cells);  // one cell per column
  void rule();                               // a dashed line between rows (before a total)
  std::string str(const std::string& indent = "") const;

private:
  std::vector<std::string> headers_;
  std::vector<Align> aligns_;
  std::vector<std::vector<std::string>> rows_;  // an empty row is a rule
};

std::string fmt_ms(double ns);             // "12.345"
std::string fmt_us(double ns);             // "123.4"
std::string fmt_pct(double fraction);      // "12.3%"
std::string fmt_rate(double v);            // 3 significant digits: "1.23", "45.6", "789"
std::string fmt_mib(double bytes);         // "12.3"
std::string fmt_bytes(double bytes);       // "12.3 MiB", "1.20 GiB", "512 B"
std::string fmt_opt(const std::optional<double>& v, const char* unit = "");  // "n/a" when absent
std::string csv_field(const std::string& s);  // quoted (RFC 4180) when it holds a comma, quote, CR or LF

}  // namespace duet::profiler
