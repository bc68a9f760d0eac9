// How the cpu backend chooses between two ways of running an op: oneDNN's default kernel or a
// faster alternative (Winograd convolution, duet's own depthwise and small-matrix kernels).
// automatic picks by shape, as the measurements in each kernel's header say; always and never
// force the choice, so tests can check both paths on any machine and benchmarks can compare them.
#pragma once

namespace duet::cpu {

enum class KernelPolicy { automatic, always, never };

// The policy an environment variable sets at start-up: "0" or "never", "always", or (unset or
// anything else) automatic.
KernelPolicy policy_from_env(const char* variable);
const char* policy_name(KernelPolicy p);  // "automatic", "always", "never"

}  // namespace duet::cpu
