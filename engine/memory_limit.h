// How much memory this process may use: the machine's physical memory, or less where a control
// group limits it. A container started with --memory, a systemd unit with MemoryMax= and a Slurm
// job all run under such a limit, while sysconf() still reports the whole machine's pages; a
// cache sized from the machine would get the process killed there.
#pragma once
#include <cstdint>
#include <string>

namespace duet {

// Physical memory, or the smallest control group limit above this process where that is smaller.
// Read once per call from /proc/self/cgroup and /sys/fs/cgroup.
int64_t usable_memory_bytes();

// The smallest memory limit on the path from this process's control group up to its hierarchy's
// root, in bytes, or -1 where no level sets one. `proc_self_cgroup` is the text of
// /proc/self/cgroup ("ID:CONTROLLERS:PATH" lines); `mount_root` is where the cgroup file systems
// are mounted (/sys/fs/cgroup). Reads cgroup v2's memory.max ("0::PATH" under mount_root) and
// cgroup v1's memory.limit_in_bytes (a "memory" controller line, under mount_root/memory). Levels
// whose directory is not visible are skipped: inside a container, the path names the host's
// hierarchy, and the container's own limit sits at the mount root. Unreadable or malformed
// values count as no limit.
int64_t cgroup_memory_limit(const std::string& proc_self_cgroup, const std::string& mount_root);

}  // namespace duet
