// The "machine" section of a report: CPU model, cores, threads used, the ISA flags that decide
// which kernels oneDNN can pick (avx512f, avx512_bf16, amx), library versions. A backend adds
// what only it knows (CUDA runtime, driver, cuDNN, GPU name) through a hook, so this file
// depends on no backend.
#pragma once
#include <functional>
#include <string>
#include <nlohmann/json.hpp>

namespace duet::profiler {

// Fills its part of the machine object, e.g. m["cuda"] = {{"runtime", "12.4"}, {"gpus", [...]}}.
// Must not throw; absent facts are left out or null.
using MachineInfoHook = std::function<void(nlohmann::json& machine)>;
// Registered once per name (a second registration under the same name replaces the first).
void add_machine_info_hook(const std::string& name, MachineInfoHook hook);

// {"hostname", "os", "cpu_model", "cpu_family", "cpu_model_number", "logical_cpus",
//  "physical_cores", "threads_used", "usable_cpus", "usable_memory_bytes" (engine/machine_limits.h),
//  "isa": {"avx512f", "avx512_bf16", "amx"},
//  "onednn": "2.6.3" | null, "compiler", ...hooks}
nlohmann::json machine_info();

// The CPU as reports print it: "AMD EPYC (family 26 model 2)", or the model name alone where the
// machine object has no family (another architecture, or a report written before it was kept).
std::string cpu_name(const nlohmann::json& machine);

// Whether two machine objects describe the same CPU (the same cpu_name, which the probe file's
// name hashes too, and logical CPU count): the test that decides if a probe applies to a report.
bool same_cpu(const nlohmann::json& a, const nlohmann::json& b);

}  // namespace duet::profiler
