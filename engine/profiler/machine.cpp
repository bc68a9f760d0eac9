// The report's machine section and the hooks through which backends add to it (see machine.h).
#include "engine/profiler/machine.h"
#include <sys/utsname.h>
#include <map>
#include <mutex>
#include <omp.h>
#include <fmt/format.h>
#include "engine/machine_limits.h"
#include "engine/profiler/proc.h"

namespace duet::profiler {

namespace {
std::mutex g_hooks_mu;
std::map<std::string, MachineInfoHook>& hooks() {
  static std::map<std::string, MachineInfoHook> h;
  return h;
}
}  // namespace

void add_machine_info_hook(const std::string& name, MachineInfoHook hook) {
  std::lock_guard<std::mutex> lk(g_hooks_mu);
  hooks()[name] = std::move(hook);
}

nlohmann::json machine_info() {
  const CpuInfo cpu = read_cpu_info();
  nlohmann::json m;
  m["hostname"] = hostname();
  utsname u{};
  m["os"] = ::uname(&u) == 0 ? fmt::format("{} {} {}", u.sysname, u.release, u.machine) : std::string("unknown");
  m["cpu_model"] = cpu.model;
  m["cpu_family"] = cpu.family;
  m["cpu_model_number"] = cpu.model_number;
  m["logical_cpus"] = cpu.logical_cpus;
  m["physical_cores"] = cpu.physical_cores > 0 ? nlohmann::json(cpu.physical_cores) : nlohmann::json(nullptr);
  m["threads_used"] = omp_get_max_threads();
  // What a control group (container, Slurm job) leaves of them: a slow run under a quota is not
  // the CPU's fault, and a report should say so.
  m["usable_cpus"] = usable_cpus();
  m["usable_memory_bytes"] = usable_memory_bytes();
  m["isa"] = {{"avx2", cpu.has_flag("avx2")},
              {"avx512f", cpu.has_flag("avx512f")},
              {"avx512_bf16", cpu.has_flag("avx512_bf16")},
              {"amx", cpu.has_flag("amx_tile")}};
  m["onednn"] = nullptr;  // the cpu backend's hook fills it when that backend is built in
#if defined(__clang__)
  m["compiler"] = fmt::format("clang {}.{}.{}", __clang_major__, __clang_minor__, __clang_patchlevel__);
#elif defined(__GNUC__)
  m["compiler"] = fmt::format("gcc {}.{}.{}", __GNUC__, __GNUC_MINOR__, __GNUC_PATCHLEVEL__);
#else
  m["compiler"] = "unknown";
#endif
  m["cuda"] = nullptr;  // a hook of the CUDA backend replaces it when that backend is built in
  std::map<std::string, MachineInfoHook> hs;
  {
    std::lock_guard<std::mutex> lk(g_hooks_mu);
    hs = hooks();
  }
  for (auto& [name, hook] : hs) {
    try {
      hook(m);
    } catch (...) {  // a broken hook loses its own facts, never the report
      m["hook_errors"].push_back(name);
    }
  }
  return m;
}

std::string cpu_name(const nlohmann::json& machine) {
  if (!machine.is_object()) return "?";
  const std::string name = machine.value("cpu_model", std::string("?"));
  const std::string family = machine.value("cpu_family", std::string()), model = machine.value("cpu_model_number", std::string());
  return family.empty() ? name : fmt::format("{} (family {} model {})", name, family, model);
}

bool same_cpu(const nlohmann::json& a, const nlohmann::json& b) {
  return a.is_object() && b.is_object() && a.contains("cpu_model") && b.contains("cpu_model") &&
         cpu_name(a) == cpu_name(b) && a.value("logical_cpus", -1) == b.value("logical_cpus", -2);
}

}  // namespace duet::profiler
