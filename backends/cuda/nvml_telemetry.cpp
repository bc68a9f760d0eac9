// NVML loaded with dlopen: the few entry points used are declared here with their stable C ABI
// (NVML keeps old symbols forever and versions changed ones with _v2 names). The CUDA device is
// matched to its NVML handle by PCI bus id, since NVML's enumeration order ignores
// CUDA_VISIBLE_DEVICES and may differ from CUDA's.
#include "backends/cuda/nvml_telemetry.h"
#include <dlfcn.h>
#include <cuda_runtime_api.h>
#include <mutex>
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/device.h"
#include <fmt/format.h>

namespace duet::cuda {

namespace {

// The NVML ABI subset duet uses (nvml.h's definitions, stable since NVML 1.0/v2).
using nvmlReturn_t = int;
constexpr nvmlReturn_t kNvmlSuccess = 0;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlUtilization_t {
  unsigned int gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr int kNvmlTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
constexpr int kNvmlClockSm = 1;         // NVML_CLOCK_SM

struct Nvml {
  bool ok = false;
  std::string status;
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned int*) = nullptr;
  nvmlReturn_t (*clock)(nvmlDevice_t, int, unsigned int*) = nullptr;
};

template <class F>
bool load(void* lib, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

Nvml open_nvml() {
  Nvml n;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) lib = dlopen("libnvidia-ml.so", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    n.status = "NVML not available: libnvidia-ml.so.1 (part of the NVIDIA driver) could not be loaded";
    return n;
  }
  // Never dlclose'd: telemetry may be sampled until the process exits.
  const bool all = load(lib, "nvmlInit_v2", n.init) && load(lib, "nvmlErrorString", n.error_string) &&
                   load(lib, "nvmlDeviceGetHandleByPciBusId_v2", n.by_pci) &&
                   load(lib, "nvmlDeviceGetHandleByIndex_v2", n.by_index) &&
                   load(lib, "nvmlDeviceGetUtilizationRates", n.utilization) &&
                   load(lib, "nvmlDeviceGetMemoryInfo", n.memory) && load(lib, "nvmlDeviceGetTemperature", n.temperature) &&
                   load(lib, "nvmlDeviceGetPowerUsage", n.power) && load(lib, "nvmlDeviceGetClockInfo", n.clock);
  if (!all) {
    n.status = "NVML not available: libnvidia-ml lacks an expected entry point (driver too old)";
    return n;
  }
  const nvmlReturn_t r = n.init();
  if (r != kNvmlSuccess) {
    n.status = fmt::format("NVML not available: nvmlInit failed: {}", n.error_string(r));
    return n;
  }
  n.ok = true;
  return n;
}

const Nvml& nvml() {
  static const Nvml n = open_nvml();
  return n;
}

std::string or_na(const std::optional<double>& v, const char* fmt_spec_unit) {
  return v ? fmt::format(fmt::runtime(fmt_spec_unit), *v) : std::string("n/a");
}

}  // namespace

bool nvml_available() { return nvml().ok; }
std::string nvml_status() { return nvml().ok ? std::string("NVML loaded") : nvml().status; }

GpuTelemetry sample_telemetry(int cuda_device) {
  GpuTelemetry t;
  t.device = cuda_device;
  try {
    if (device_count() == 0) {
      t.note = unavailable_reason();
      return t;
    }
    if (cuda_device < 0 || cuda_device >= device_count()) {
      t.note = fmt::format("device cuda:{} does not exist", cuda_device);
      return t;
    }
    const Nvml& n = nvml();
    if (!n.ok) {
      t.note = n.status;
      return t;
    }
    nvmlDevice_t dev = nullptr;
    char bus[32] = {};
    if (cudaDeviceGetPCIBusId(bus, sizeof(bus), cuda_device) != cudaSuccess || n.by_pci(bus, &dev) != kNvmlSuccess) {
      (void)cudaGetLastError();
      if (n.by_index(static_cast<unsigned>(cuda_device), &dev) != kNvmlSuccess) {
        t.note = fmt::format("NVML has no handle for cuda:{}", cuda_device);
        return t;
      }
    }
    std::string missing;
    nvmlUtilization_t u{};
    if (n.utilization(dev, &u) == kNvmlSuccess) {
      t.utilization_pct = u.gpu;
      t.memory_utilization_pct = u.memory;
    } else {
      missing += " utilization";
    }
    nvmlMemory_t m{};
    if (n.memory(dev, &m) == kNvmlSuccess) {
      t.memory_used_bytes = m.used;
      t.memory_total_bytes = m.total;
    } else {
      missing += " memory";
    }
    unsigned int v = 0;
    if (n.temperature(dev, kNvmlTemperatureGpu, &v) == kNvmlSuccess) t.temperature_c = v;
    else missing += " temperature";
    if (n.power(dev, &v) == kNvmlSuccess) t.power_w = v / 1000.0;  // NVML reports milliwatts
    else missing += " power";
    if (n.clock(dev, kNvmlClockSm, &v) == kNvmlSuccess) t.sm_clock_mhz = v;
    else missing += " sm_clock";
    if (!missing.empty()) t.note = "not reported by this GPU/driver:" + missing;
  } catch (const std::exception& e) {
    t.note = e.what();
  }
  return t;
}

std::string format_telemetry(const GpuTelemetry& t) {
  std::string mem = "n/a";
  if (t.memory_used_bytes && t.memory_total_bytes)
    mem = format_bytes(double(*t.memory_used_bytes)) + " / " + format_bytes(double(*t.memory_total_bytes));
  std::string s = fmt::format("cuda:{} util {} | mem {} | {} | {} | SM {}", t.device, or_na(t.utilization_pct, "{:.0f}%"), mem,
                              or_na(t.temperature_c, "{:.0f} C"), or_na(t.power_w, "{:.0f} W"),
                              or_na(t.sm_clock_mhz, "{:.0f} MHz"));
  if (!t.note.empty()) s += " (" + t.note + ")";
  return s;
}

}  // namespace duet::cuda
