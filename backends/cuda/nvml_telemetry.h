// GPU telemetry through NVML: utilisation, memory, temperature, power and SM clock of a CUDA
// device, for the profiler's reports and `duet` run logs. NVML ships with the driver, not with
// every CUDA Toolkit, so it is loaded at run time (dlopen of libnvidia-ml.so.1): a build needs
// neither its header nor its library, and on a machine without it every reading is absent
// (std::nullopt, never a misleading zero) and `note` says why.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace duet::cuda {

struct GpuTelemetry {
  int device = 0;                                // CUDA device index
  std::optional<double> utilization_pct;         // % of the last sample period a kernel ran
  std::optional<double> memory_utilization_pct;  // % of the period device memory was read or written
  std::optional<uint64_t> memory_used_bytes, memory_total_bytes;
  std::optional<double> temperature_c;
  std::optional<double> power_w;
  std::optional<double> sm_clock_mhz;
  std::string note;  // why readings are absent ("" when all are present)
};

// One reading of every counter; never throws.
GpuTelemetry sample_telemetry(int cuda_device);
// Whether libnvidia-ml could be loaded and initialised, and if not why.
bool nvml_available();
std::string nvml_status();
// "util 87% | mem 10.20 GiB / 80.00 GiB | 64 C | 310 W | SM 1755 MHz", with "n/a" for absent values.
std::string format_telemetry(const GpuTelemetry& t);

}  // namespace duet::cuda
