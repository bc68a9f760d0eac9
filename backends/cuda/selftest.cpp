// What `duet selftest --device cuda` prints around the op table's results (cli/selftest.cpp
// runs the table): the device, its software versions and telemetry before, the caching allocator's
// counters after.
#include "backends/cuda/selftest.h"
#include <cudnn.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cublas_library.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/nvml_telemetry.h"

namespace duet {

std::string cuda_selftest_header(int device) {
  cudaDeviceProp prop{};
  int driver = 0, runtime = 0;
  (void)cuda::handled(cudaGetDeviceProperties(&prop, device));
  (void)cuda::handled(cudaDriverGetVersion(&driver));
  (void)cuda::handled(cudaRuntimeGetVersion(&runtime));
  int cublas_version = 0;  // the op table's matrix cases load cuBLAS anyway
  (void)cuda::cublas_library("duet selftest").cublasGetProperty(MAJOR_VERSION, &cublas_version);
  return fmt::format("device cuda:{} {} (sm_{}{}, {}), driver {}.{}, runtime {}.{}, cuDNN {}, cuBLAS {}.x, TF32 {}\n{}\n", device,
                     prop.name, prop.major, prop.minor, cuda::format_bytes(double(prop.totalGlobalMem)), driver / 1000,
                     (driver % 1000) / 10, runtime / 1000, (runtime % 1000) / 10, cudnnGetVersion(), cublas_version,
                     cuda_allow_tf32() ? "on" : "off", cuda::format_telemetry(cuda::sample_telemetry(device)));
}

std::string cuda_selftest_footer(int device) {
  const cuda::CachingStats cs = cuda::allocator(device).caching_stats();
  return fmt::format("allocator: {} reserved, {} cached, {} cudaMalloc calls, {} cache hits\n",
                     cuda::format_bytes(double(cs.reserved)), cuda::format_bytes(double(cs.cached)), cs.source_allocs,
                     cs.cache_hits);
}

}  // namespace duet
