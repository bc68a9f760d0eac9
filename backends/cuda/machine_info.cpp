#include "backends/cuda/machine_info.h"
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <fmt/format.h>
#include "backends/cuda/cublas_library.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"

namespace duet::cuda {

void describe_machine(nlohmann::json& machine) noexcept {
  try {
    nlohmann::json c = nlohmann::json::object();
    int runtime = 0, driver = 0;
    c["runtime"] = cudaRuntimeGetVersion(&runtime) == cudaSuccess ? nlohmann::json(cuda_version_str(runtime)) : nullptr;
    // 0 means no driver is installed: absent, not "0.0".
    c["driver"] = cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0 ? nlohmann::json(cuda_version_str(driver))
                                                                              : nullptr;
    const size_t cudnn = cudnnGetVersion();  // cuDNN 9: major * 10000 + minor * 100 + patch
    c["cudnn"] = fmt::format("{}.{}.{}", cudnn / 10000, (cudnn % 10000) / 100, cudnn % 100);
    // null where this process ran no GPU matrix product: asking cuBLAS would load it (cublas_library.h).
    const std::optional<std::string> blas = loaded_cublas_version();
    c["cublas"] = blas ? nlohmann::json(*blas) : nullptr;
    nlohmann::json gpus = nlohmann::json::array();
    const int n = device_count();
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp p{};
      if (handled(cudaGetDeviceProperties(&p, i)) != cudaSuccess) continue;
      gpus.push_back({{"index", i},
                      {"name", p.name},
                      {"compute_capability", fmt::format("{}.{}", p.major, p.minor)},
                      {"memory_bytes", static_cast<int64_t>(p.totalGlobalMem)},
                      {"multiprocessors", p.multiProcessorCount}});
    }
    c["gpus"] = gpus;
    // The settings that change which kernels run, so two reports say whether they are comparable.
    c["allow_tf32"] = cuda_allow_tf32();
    c["cudnn_benchmark"] = cuda_cudnn_benchmark();
    c["unavailable"] = n == 0 ? nlohmann::json(unavailable_reason()) : nullptr;
    machine["cuda"] = c;
  } catch (...) {
    machine["cuda"] = nullptr;  // a report must not fail for want of GPU facts
  }
}

}  // namespace duet::cuda
