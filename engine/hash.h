// FNV-1a, 64-bit: a stable hash of bytes (the same on every machine and every run, unlike
// std::hash), for fingerprints that are compared across processes or stored in files.
#pragma once
#include <cstdint>
#include <string_view>

namespace duet {

constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// `h` continues an earlier hash, so a sequence of strings can be folded into one value.
inline uint64_t fnv1a(std::string_view s, uint64_t h = kFnv1aOffset) {
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace duet
