// What this process may use of the machine: memory and CPUs. A container started with --memory or
// --cpus, a systemd unit with MemoryMax= or CPUQuota= and a Slurm job all run under a control
// group's limits, while sysconf() still reports the whole machine: a cache sized from the
// machine's memory gets the process killed there, and one OpenMP thread per host core under a
// quota of two cores makes every barrier wait for descheduled threads.
#pragma once
#include <cstdint>
#include <string>

namespace duet {

// Physical memory, or the tightest control group memory limit above this process where smaller.
int64_t usable_memory_bytes();

// The CPUs' worth of time a control group's CPU quota allows, rounded up as the JVM and Go's
// runtime round it (2.5 CPUs: 3), or 0 where no group sets a quota. The processes of one group
// share it.
int cpu_quota();

// The CPUs this process may run on (its affinity mask), or cpu_quota() where smaller. At least 1.
int usable_cpus();

// The tightest limit on the path from this process's control group up to its hierarchy's root, or
// -1 where no level sets one. `proc_self_cgroup` is the text of /proc/self/cgroup
// ("ID:CONTROLLERS:PATH" lines); `mount_root` is where the cgroup file systems are mounted
// (/sys/fs/cgroup): cgroup v2's files (the "0::PATH" line) under mount_root, v1's under
// mount_root/memory or mount_root/cpu (or, where there is no such link, under the name of all the
// hierarchy's controllers as the line lists them: mount_root/cpu,cpuacct). Levels whose directory
// is not visible are skipped: inside a container the path names the host's hierarchy, and the
// container's own limit sits at the mount root. Missing, unreadable or malformed files count as no
// limit.
//
// Memory in bytes: v2's memory.max ("max": none), v1's memory.limit_in_bytes (its "unlimited" is a
// huge number, which usable_memory_bytes' minimum with physical memory absorbs).
int64_t cgroup_memory_limit(const std::string& proc_self_cgroup, const std::string& mount_root);
// CPU time in thousandths of a CPU: v2's cpu.max ("QUOTA PERIOD" in microseconds, "max PERIOD":
// none), v1's cpu.cfs_quota_us / cpu.cfs_period_us (quota -1: none).
int64_t cgroup_cpu_limit_millis(const std::string& proc_self_cgroup, const std::string& mount_root);

}  // namespace duet
