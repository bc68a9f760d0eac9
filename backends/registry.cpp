// Which backends this binary has: each one built in is added to the engine's table here, at
// start-up, in one place a reader can see whole. The build links this file whole into every
// program (CMake's WHOLE_ARCHIVE), so a linker can never drop it for being unreferenced.
#include "backends/reference/reference_backend.h"
#include "engine/backend.h"
#include "engine/profiler/machine.h"
#ifdef DUET_HAVE_DNNL
#include "backends/cpu/cpu_backend.h"
#endif
#ifdef DUET_HAVE_CUDA
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/machine_info.h"
#endif

namespace duet {
namespace {

const bool g_registered = [] {
  register_backend(Backend::reference, &reference_backend);
#ifdef DUET_HAVE_DNNL
  register_backend(Backend::cpu, &cpu_backend);
  profiler::add_machine_info_hook("onednn", &cpu_describe_machine);
#endif
#ifdef DUET_HAVE_CUDA
  register_backend(Backend::cuda, &cuda_backend);
  register_device_type(DeviceType::cuda, &cuda_allocator, &cuda_device_count);
  // The CUDA runtime, driver, cuDNN, cuBLAS and GPUs in every report's machine section.
  profiler::add_machine_info_hook("cuda", [](nlohmann::json& m) { cuda::describe_machine(m); });
#endif
  return true;
}();

}  // namespace
}  // namespace duet
