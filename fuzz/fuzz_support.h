// libFuzzer targets' shared part: readers that take a path get the input through a file, and
// only duet::Error may leave a reader (anything else -- nlohmann's exceptions, std::out_of_range
// -- would reach users as "internal error" and is a finding; so are crashes and sanitizer reports).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unistd.h>
#include "engine/error.h"

namespace duet::fuzz {

// A file holding the input, rewritten for each one (one per process: libFuzzer's -jobs and
// -workers run separate processes), removed when the process exits normally.
inline const std::string& input_file(const uint8_t* data, size_t size, const char* suffix) {
  static const std::string path = [&] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/duet_fuzz_" + std::to_string(::getpid()) + suffix;
  }();
  static const int removed_at_exit = std::atexit([] { std::remove(path.c_str()); });
  (void)removed_at_exit;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  return path;
}

// Runs `f`; duet::Error is the expected way to refuse an input.
template <class F>
void expect_only_duet_errors(F&& f) {
  try {
    f();
  } catch (const duet::Error&) {
  }
}

}  // namespace duet::fuzz
