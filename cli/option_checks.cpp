// Numeric option validators (see option_checks.h).
#include "cli/option_checks.h"
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fmt/format.h>

namespace duet::app {

CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        const std::string expected = fmt::format("expected a finite number in [{:g}, {:g}]", lo, hi);
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size())
          return fmt::format("'{}' is not a number; {}", text, expected);
        if (errno == ERANGE && std::isinf(v)) return fmt::format("{} overflows a double; {}", text, expected);
        if (!std::isfinite(v)) return fmt::format("{} is not finite; {}", text, expected);
        if (v < lo || v > hi) return fmt::format("{} is out of range; {}", text, expected);
        return "";
      },
      fmt::format("FLOAT in [{:g} - {:g}]", lo, hi), "FINITE_RANGE");
}

}  // namespace duet::app
