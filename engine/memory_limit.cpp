#include "engine/memory_limit.h"
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>

namespace duet {

namespace {

// The limit one file states, or -1: "max" (v2, unlimited), a missing file and anything that is
// not a positive number all mean none. v1's "unlimited" is a huge number, which the caller's
// minimum with physical memory absorbs.
int64_t limit_in_file(const std::string& path) {
  std::ifstream f(path);
  std::string v;
  if (!(f >> v) || v == "max") return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v.c_str(), &end, 10);
  return end != v.c_str() && *end == '\0' && n > 0 ? static_cast<int64_t>(n) : -1;
}

// The tighter of two limits, -1 meaning none.
int64_t tighter(int64_t a, int64_t b) { return a < 0 ? b : b < 0 ? a : std::min(a, b); }

bool has_memory_controller(const std::string& controllers) {
  std::stringstream s(controllers);
  std::string c;
  while (std::getline(s, c, ','))
    if (c == "memory") return true;
  return false;
}

// The smallest limit in `file` of the directories dir + path, dir + parent(path), ... dir.
int64_t smallest_limit_up_from(const std::string& dir, std::string path, const std::string& file) {
  int64_t smallest = -1;
  while (true) {
    while (!path.empty() && path.back() == '/') path.pop_back();
    smallest = tighter(smallest, limit_in_file(dir + path + "/" + file));
    if (path.empty()) return smallest;
    path.erase(path.rfind('/') == std::string::npos ? 0 : path.rfind('/'));
  }
}

}  // namespace

int64_t cgroup_memory_limit(const std::string& proc_self_cgroup, const std::string& mount_root) {
  int64_t smallest = -1;
  std::stringstream lines(proc_self_cgroup);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (path.empty() || path[0] != '/') continue;
    if (id == "0" && controllers.empty())
      smallest = tighter(smallest, smallest_limit_up_from(mount_root, path, "memory.max"));
    else if (has_memory_controller(controllers))
      smallest = tighter(smallest, smallest_limit_up_from(mount_root + "/memory", path, "memory.limit_in_bytes"));
  }
  return smallest;
}

int64_t usable_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  const int64_t physical = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : int64_t{8} << 30;
  std::ifstream f("/proc/self/cgroup");
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return tighter(physical, cgroup_memory_limit(text, "/sys/fs/cgroup"));
}

}  // namespace duet
