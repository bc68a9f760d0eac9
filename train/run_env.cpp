// The global options' effect on the process (see run_env.h).
#include "train/run_env.h"
#include <omp.h>
#include <cstdlib>
#include <fstream>
#include <fmt/format.h>
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/machine_limits.h"
#ifdef DUET_HAVE_DNNL
#include "backends/cpu/threads.h"
#endif

namespace duet::app {

RunEnv apply_global_options(const GlobalOptions& g) {
  RunEnv env;
  env.device = Device::parse(g.device);
  if (env.device.type == DeviceType::cuda)
    DUET_CHECK(backend_available(Backend::cuda),
               "--device {}: this duet was built without the CUDA backend (available backends: {}); rebuild with "
               "-DDUET_CUDA=ON on a machine with the CUDA Toolkit and cuDNN, or use --device cpu",
               g.device, available_backends_str());
  if (!g.backend.empty()) {
    const Backend b = backend_from_name(g.backend);
    const bool fits = env.device.type == DeviceType::cuda ? b == Backend::cuda : b != Backend::cuda;
    DUET_CHECK(fits, "--backend {} cannot compute on --device {}: expected {}", g.backend, env.device.str(),
               env.device.type == DeviceType::cuda ? "cuda" : "reference or cpu");
    set_default_backend(env.device.type, b);
  }
  env.backend = default_backend(env.device.type);
  // Left to itself, OpenMP starts a thread per CPU of the affinity mask, also where a control
  // group's CPU quota allows fewer (a container's --cpus): then every barrier waits for threads
  // the quota has descheduled.
  const int threads = g.threads > 0 ? g.threads : std::getenv("OMP_NUM_THREADS") ? 0 : usable_cpus();
  if (threads > 0) {
#ifdef DUET_HAVE_DNNL
    set_num_threads(threads);
#else
    omp_set_num_threads(threads);
#endif
  }
  env.threads = omp_get_max_threads();
  return env;
}

MemoryFormat input_memory_format(const std::string& name, const RunEnv& env) {
  if (name == "nhwc" || name == "channels_last") return MemoryFormat::channels_last;
  if (name == "nchw" || name == "contiguous") return MemoryFormat::contiguous;
  DUET_CHECK(name == "auto", "--memory-format {}: expected auto, nhwc or nchw", name);
  return env.device.type == DeviceType::cpu && env.backend == Backend::cpu ? MemoryFormat::channels_last
                                                                            : MemoryFormat::contiguous;
}

const char* memory_format_label(MemoryFormat f) { return f == MemoryFormat::channels_last ? "nhwc" : "nchw"; }

std::string busy_machine_note(int threads) {
  std::ifstream f("/proc/loadavg");
  double load = 0;
  if (!(f >> load) || threads <= 1) return "";
  const int cores = omp_get_num_procs();
  if (load < static_cast<double>(cores)) return "";
  return fmt::format("note: the machine is busy (load average {:.1f} on {} cores): {} OpenMP threads will wait on each "
                     "other; --threads 1 can be several times faster until the load drops\n",
                     load, cores, threads);
}

std::string precision_note(const RunEnv& env, const std::string& amp) {
  if (amp != "bf16" && amp != "fp16") return "";
  const DType dt = amp == "bf16" ? DType::bf16 : DType::f16;
  const DTypeSupport s = backend(env.backend).support(OpId::conv2d, dt);
  if (s.coverage != Coverage::reference_loops) return "";
  return fmt::format("note: --amp {} runs its convolutions and matrix products on the reference loops here ({}): "
                     "many times slower than --amp off\n",
                     amp, s.why);
}

}  // namespace duet::app
