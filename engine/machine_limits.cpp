#include "engine/machine_limits.h"
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace duet {

namespace {

// The whitespace-separated words of a small file; none where it cannot be read.
std::vector<std::string> words_of(const std::string& path) {
  std::ifstream f(path);
  return {std::istream_iterator<std::string>(f), std::istream_iterator<std::string>()};
}

// A positive decimal number, or -1 (for "max", "-1", "12abc", "").
int64_t positive_number(const std::string& v) {
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return end != v.c_str() && *end == '\0' && n > 0 ? static_cast<int64_t>(n) : -1;
}

// The tighter of two limits, -1 meaning none.
int64_t tighter(int64_t a, int64_t b) { return a < 0 ? b : b < 0 ? a : std::min(a, b); }

// One level's limit, read from the group directory it is given; -1 where that level sets none.
using LevelLimit = std::function<int64_t(const std::string& dir)>;

// The tightest limit of the directories dir + path, dir + parent(path), ... dir.
int64_t tightest_up_from(const std::string& dir, std::string path, const LevelLimit& level) {
  int64_t tightest = -1;
  while (true) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    tightest = tighter(tightest, level(dir + path));
    if (path.empty()) return tightest;
    path.erase(path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  }
}

bool lists(const std::string& controllers, const std::string& name) {
  std::stringstream s(controllers);
  std::string c;
  while (std::getline(s, c, ','))
    if (c == name) return true;
  return false;
}

// Where a cgroup v1 hierarchy holding `controller` is mounted: mount_root/controller, or where
// that does not exist, the directory named for all the hierarchy's controllers, as systemd mounts
// them (/sys/fs/cgroup/cpu,cpuacct; the distributions add the cpu link, a bare mount may not).
std::string v1_hierarchy(const std::string& mount_root, const std::string& controller,
                         const std::string& controllers) {
  const std::string own = mount_root + "/" + controller;
  struct stat st {};
  return stat(own.c_str(), &st) == 0 ? own : mount_root + "/" + controllers;
}

// The tightest limit over the process's groups: the v2 group ("0::PATH") read by `v2`, the v1
// group of `controller` (under v1_hierarchy) read by `v1`.
int64_t tightest_limit(const std::string& proc_self_cgroup, const std::string& mount_root, const LevelLimit& v2,
                       const std::string& controller, const LevelLimit& v1) {
  int64_t tightest = -1;
  std::stringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (id == "0" && controllers.empty()) tightest = tighter(tightest, tightest_up_from(mount_root, path, v2));
    else if (lists(controllers, controller))
      tightest = tighter(tightest, tightest_up_from(v1_hierarchy(mount_root, controller, controllers), path, v1));
  }
  return tightest;
}

// A quota of `quota` microseconds of CPU time per `period`, in thousandths of a CPU (a quota too
// large to scale is none).
int64_t cpu_millis(int64_t quota, int64_t period) {
  return quota > 0 && period > 0 && quota <= std::numeric_limits<int64_t>::max() / 1000 ? quota * 1000 / period : -1;
}

std::string proc_self_cgroup() {
  std::ifstream f("/proc/self/cgroup");
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

constexpr const char* kCgroupMount = "/sys/fs/cgroup";

}  // namespace

int64_t cgroup_memory_limit(const std::string& proc_self_cgroup, const std::string& mount_root) {
  const auto file = [](const char* name) {
    return [name](const std::string& dir) {
      const auto w = words_of(dir + "/" + name);
      return w.size() == 1 ? positive_number(w[0]) : -1;
    };
  };
  return tightest_limit(proc_self_cgroup, mount_root, file("memory.max"), "memory", file("memory.limit_in_bytes"));
}

int64_t cgroup_cpu_limit_millis(const std::string& proc_self_cgroup, const std::string& mount_root) {
  const LevelLimit v2 = [](const std::string& dir) {
    const auto w = words_of(dir + "/cpu.max");
    return w.size() == 2 ? cpu_millis(positive_number(w[0]), positive_number(w[1])) : -1;
  };
  const LevelLimit v1 = [](const std::string& dir) {
    const auto quota = words_of(dir + "/cpu.cfs_quota_us"), period = words_of(dir + "/cpu.cfs_period_us");
    return quota.size() == 1 && period.size() == 1 ? cpu_millis(positive_number(quota[0]), positive_number(period[0]))
                                                   : -1;
  };
  return tightest_limit(proc_self_cgroup, mount_root, v2, "cpu", v1);
}

int64_t usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const int64_t physical = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;
  return tighter(physical, cgroup_memory_limit(proc_self_cgroup(), kCgroupMount));
}

int cpu_quota() {
  const int64_t millis = cgroup_cpu_limit_millis(proc_self_cgroup(), kCgroupMount);
  return millis > 0 ? static_cast<int>(std::min<int64_t>((millis + 999) / 1000, std::numeric_limits<int>::max())) : 0;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : static_cast<int>(online);
  const int quota = cpu_quota();
  return std::max(1, quota > 0 ? std::min(affinity, quota) : affinity);
}

}  // namespace duet
