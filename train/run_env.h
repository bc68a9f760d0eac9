// The options every sub-command shares (--device, --backend, --threads, --seed; parsed by
// cli/global_options.h) and applying them to the process: which device and backend compute, how
// many OpenMP threads, and the input memory format that follows from them.
#pragma once
#include <cstdint>
#include <string>
#include "engine/device.h"
#include "engine/tensor.h"

namespace duet::app {

struct GlobalOptions {
  std::string device = "cpu";
  std::string backend;  // empty: the device's default (cpu: oneDNN when built, cuda: cuda)
  int threads = 0;      // 0: OMP_NUM_THREADS, else usable_cpus() (engine/machine_limits.h)
  uint64_t seed = 0;
};

struct RunEnv {
  Device device;
  Backend backend = Backend::reference;
  int threads = 1;
};

// Sets the backend and thread count; throws duet::Error for a device this build or machine lacks.
RunEnv apply_global_options(const GlobalOptions& g);

// "auto" resolves to channels-last on the oneDNN cpu backend (its convolutions run about twice
// as fast on NHWC), NCHW elsewhere.
MemoryFormat input_memory_format(const std::string& name, const RunEnv& env);
const char* memory_format_label(MemoryFormat f);  // "nhwc" / "nchw"

// A one-line note when other processes already keep the cores busy (1-minute load average of
// /proc/loadavg at least the core count) and more than one thread is asked for: OpenMP teams then
// wait on descheduled threads at every barrier, which measured here cost 5-15x. "" otherwise.
std::string busy_machine_note(int threads);

// A one-line note when --amp's dtype (bf16, fp16) has no kernel for convolutions on the backend and
// CPU at hand, which then hands them to the reference loops (bf16 on a CPU without AVX-512: oneDNN
// 2.6 has no bf16 kernels there), so that a user meets "many times slower" before the first epoch
// instead of after it. "" otherwise.
std::string precision_note(const RunEnv& env, const std::string& amp);

}  // namespace duet::app
