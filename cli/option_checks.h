// Validators for numeric command-line options. CLI11's Range compares with < and >, which NaN
// never satisfies, so "--lr nan" passed it; these refuse NaN, infinities and text that is not
// a whole number, and CLI11 prefixes their message with the option's name.
#pragma once
#include <CLI/CLI.hpp>

namespace duet::app {

// A finite floating-point value in [lo, hi]; for a list option every element is checked.
CLI::Validator finite_range(double lo, double hi);

}  // namespace duet::app
