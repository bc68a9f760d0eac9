// duet::Error: the one exception type. Every message names what was wrong and what was expected,
// so a user can act on it without reading the source.
#pragma once
#include <stdexcept>
#include <string>
#include <fmt/format.h>

namespace duet {

class Error : public std::runtime_error {
public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// DUET_CHECK(cond, "fmt {}", args...): throws duet::Error with the formatted message.
#define DUET_CHECK(cond, ...)                                      \
  do {                                                             \
    if (!(cond)) throw ::duet::Error(::fmt::format(__VA_ARGS__));  \
  } while (0)

}  // namespace duet
