// Which backends this binary has, and each device's allocator. Explicit on purpose: a reader sees
// every backend in one switch, and no static-initialisation order or linker dead-stripping can
// make one silently disappear.
#include "backends/registry.h"
#ifdef DUET_HAVE_CUDA
#include "backends/cuda/machine_info.h"
#include "engine/profiler/machine.h"
#endif

namespace duet {

#ifdef DUET_HAVE_CUDA
namespace {
// The CUDA runtime, driver, cuDNN, cuBLAS and GPUs in every report's machine section. This file is
// always linked (every op dispatch goes through it), so its initialiser always runs.
const bool g_cuda_machine_info = [] {
  profiler::add_machine_info_hook("cuda", [](nlohmann::json& m) { cuda::describe_machine(m); });
  return true;
}();
}  // namespace
#endif

bool backend_available(Backend b) {
  switch (b) {
    case Backend::reference: return true;
    case Backend::cpu:
#ifdef DUET_HAVE_DNNL
      return true;
#else
      return false;
#endif
    case Backend::cuda:
#ifdef DUET_HAVE_CUDA
      return true;
#else
      return false;
#endif
  }
  return false;
}

std::string available_backends_str() {
  std::string s;
  for (Backend b : {Backend::reference, Backend::cpu, Backend::cuda})
    if (backend_available(b)) s += (s.empty() ? "" : ", ") + std::string(backend_name(b));
  return s;
}

BackendImpl& backend(Backend b) {
  switch (b) {
    case Backend::reference: return reference_backend();
#ifdef DUET_HAVE_DNNL
    case Backend::cpu: return cpu_backend();
#endif
#ifdef DUET_HAVE_CUDA
    case Backend::cuda: return cuda_backend();
#endif
    default: break;
  }
  throw Error(fmt::format("backend '{}' is not built into this binary (available: {}); rebuild with {}", backend_name(b),
                          available_backends_str(), b == Backend::cuda ? "-DDUET_CUDA=ON" : "oneDNN (libdnnl-dev)"));
}

Allocator& device_allocator(Device d) {
  if (d.type == DeviceType::cpu) return cpu_allocator();
#ifdef DUET_HAVE_CUDA
  return cuda_allocator(d.index);
#else
  throw Error(fmt::format("device '{}' needs the cuda backend, which is not built into this binary (available: {})",
                          d.str(), available_backends_str()));
#endif
}

}  // namespace duet
