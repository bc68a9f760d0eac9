#include "backends/cpu/kernel_policy.h"

#include <cstdlib>
#include <cstring>

namespace duet::cpu {

KernelPolicy policy_from_env(const char* variable) {
  const char* v = std::getenv(variable);
  if (v == nullptr) return KernelPolicy::automatic;
  if (std::strcmp(v, "0") == 0 || std::strcmp(v, "never") == 0) return KernelPolicy::never;
  if (std::strcmp(v, "always") == 0) return KernelPolicy::always;
  return KernelPolicy::automatic;
}

const char* policy_name(KernelPolicy p) {
  switch (p) {
    case KernelPolicy::always: return "always";
    case KernelPolicy::never: return "never";
    default: return "automatic";
  }
}

}  // namespace duet::cpu
