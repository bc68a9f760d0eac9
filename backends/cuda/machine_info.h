// The CUDA part of a profile report's "machine" section: runtime, driver, cuDNN and cuBLAS
// versions and the GPUs present (name, compute capability, memory), so CPU and GPU runs compared
// later say what they ran on. Registered with profiler::add_machine_info_hook by the backend
// registry; never throws, and a machine without a driver or GPU gets "gpus": [] and the reason.
#pragma once
#include <nlohmann/json.hpp>

namespace duet::cuda {

void describe_machine(nlohmann::json& machine) noexcept;

}  // namespace duet::cuda
