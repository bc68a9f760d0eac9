#include "backends/cuda/arch_support.h"
#include <algorithm>
#include <cstdlib>

namespace duet::cuda {

bool arch_supported(int major, int minor, std::string_view archs) {
  const int cc = major * 10 + minor;
  size_t pos = 0;
  while (pos <= archs.size()) {
    const size_t end = std::min(archs.find_first_of(",;", pos), archs.size());
    const std::string_view entry = archs.substr(pos, end - pos);
    pos = end + 1;
    if (entry.empty()) continue;
    if (entry == "native" || entry == "all" || entry == "all-major") return true;
    const size_t dash = entry.find('-');
    const std::string_view number = entry.substr(0, dash), kind = dash == std::string_view::npos ? "" : entry.substr(dash + 1);
    const int arch = std::atoi(std::string(number).c_str());
    if (arch <= 0) continue;
    const bool real = kind.empty() || kind == "real", virt = kind.empty() || kind == "virtual";
    if (real && arch / 10 == major && cc >= arch) return true;
    if (virt && cc >= arch) return true;
  }
  return false;
}

std::string built_archs() { return DUET_CUDA_ARCHS; }

}  // namespace duet::cuda
