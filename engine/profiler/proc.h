// What Linux says about this process and machine (/proc): resident memory, CPU time, the CPU model
// and its ISA flags. Every reading is optional: off Linux, or in a sandbox that hides /proc, a
// value is absent (null in reports), never a misleading zero.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace duet::profiler {

struct ProcessMemory {
  std::optional<int64_t> rss_bytes;  // VmRSS: resident now
  std::optional<int64_t> hwm_bytes;  // VmHWM: resident high-water mark of the process
};
ProcessMemory read_process_memory();

// CPU time this process has used (utime + stime), in seconds.
std::optional<double> read_process_cpu_seconds();
// Machine-wide jiffies from /proc/stat's "cpu" line: busy (all but idle + iowait) and total.
struct MachineCpuTicks {
  uint64_t busy = 0, total = 0;
};
std::optional<MachineCpuTicks> read_machine_cpu_ticks();

struct CpuInfo {
  std::string model;  // "model name" of the first processor ("unknown" when absent)
  // x86's "cpu family" and "model" numbers ("" where /proc/cpuinfo has none). A virtual machine's
  // model name may name only the vendor ("AMD EPYC"); these tell its generation (AMD family 25:
  // Zen 3 and 4, 26: Zen 5).
  std::string family, model_number;
  int logical_cpus = 0;   // processors online
  int physical_cores = 0; // distinct (physical id, core id) pairs; 0 when /proc hides them
  std::vector<std::string> flags;  // all of the first processor's flags
  bool has_flag(const std::string& f) const;
};
CpuInfo read_cpu_info();

std::string hostname();

}  // namespace duet::profiler
