// Readers of /proc: process memory and CPU time, machine CPU ticks, the CPU model (see proc.h).
#include "engine/profiler/proc.h"
#include <unistd.h>
#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

namespace duet::profiler {

namespace {
// "VmRSS:	  123456 kB" -> bytes
std::optional<int64_t> status_kb(const std::string& text, const std::string& key) {
  const size_t at = text.find(key + ":");
  if (at == std::string::npos) return std::nullopt;
  std::istringstream ss(text.substr(at + key.size() + 1));
  int64_t kb = 0;
  if (!(ss >> kb)) return std::nullopt;
  return kb * 1024;
}
std::string slurp(const char* path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  const size_t b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? std::string() : s.substr(a, b - a + 1);
}
}  // namespace

ProcessMemory read_process_memory() {
  const std::string s = slurp("/proc/self/status");
  return {status_kb(s, "VmRSS"), status_kb(s, "VmHWM")};
}

std::optional<double> read_process_cpu_seconds() {
  const std::string s = slurp("/proc/self/stat");
  // The command name (field 2) is in parentheses and may hold spaces: parse after the last ')'.
  const size_t close = s.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream ss(s.substr(close + 1));
  std::string field;
  // Fields after ')' start at field 3 (state); utime and stime are fields 14 and 15.
  for (int i = 3; i <= 13; ++i)
    if (!(ss >> field)) return std::nullopt;
  uint64_t utime = 0, stime = 0;
  if (!(ss >> utime >> stime)) return std::nullopt;
  const long hz = ::sysconf(_SC_CLK_TCK);
  if (hz <= 0) return std::nullopt;
  return static_cast<double>(utime + stime) / static_cast<double>(hz);
}

std::optional<MachineCpuTicks> read_machine_cpu_ticks() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  if (!(in >> cpu) || cpu != "cpu") return std::nullopt;
  uint64_t v[10] = {};
  int n = 0;
  while (n < 10 && in >> v[n]) ++n;
  if (n < 4) return std::nullopt;
  MachineCpuTicks t;
  // user nice system idle iowait irq softirq steal (guest is already inside user)
  for (int i = 0; i < std::min(n, 8); ++i) t.total += v[i];
  const uint64_t idle = v[3] + (n > 4 ? v[4] : 0);
  t.busy = t.total - idle;
  return t;
}

bool CpuInfo::has_flag(const std::string& f) const { return std::find(flags.begin(), flags.end(), f) != flags.end(); }

CpuInfo read_cpu_info() {
  CpuInfo info;
  std::ifstream in("/proc/cpuinfo");
  std::string line, physical = "0";
  std::set<std::pair<std::string, std::string>> cores;
  int processors = 0;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    const std::string key = trim(line.substr(0, colon)), value = trim(line.substr(colon + 1));
    if (key == "processor") ++processors;
    else if (key == "model name" && info.model.empty()) info.model = value;
    else if (key == "cpu family" && info.family.empty()) info.family = value;
    else if (key == "model" && info.model_number.empty()) info.model_number = value;
    else if (key == "physical id") physical = value;
    else if (key == "core id") cores.emplace(physical, value);
    else if (key == "flags" && info.flags.empty()) {
      std::istringstream ss(value);
      std::string f;
      while (ss >> f) info.flags.push_back(f);
    }
  }
  if (info.model.empty()) info.model = "unknown";
  info.logical_cpus = processors > 0 ? processors : static_cast<int>(std::thread::hardware_concurrency());
  info.physical_cores = static_cast<int>(cores.size());
  return info;
}

std::string hostname() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "unknown-host";
  return buf;
}

}  // namespace duet::profiler
