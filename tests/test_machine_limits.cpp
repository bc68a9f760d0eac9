// Which memory and CPUs the process may use: the control group limits read from fake cgroup trees
// (v1, v2, containers, malformed files), and the real process's values within the machine's.
#include <sched.h>
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include "engine/machine_limits.h"
#include "tests/test_support.h"

using namespace duet;

// A fake /sys/fs/cgroup in a temporary folder: the limits are read from the files of the process's
// group and of every group above it, under either cgroup version.
class CgroupTree : public ::testing::Test {
protected:
  void SetUp() override {
    root_ = std::filesystem::temp_directory_path() / fmt::format("duet_test_cgroup_{}", ::getpid());
    std::filesystem::remove_all(root_);
  }
  void TearDown() override { std::filesystem::remove_all(root_); }
  void limit(const std::string& dir, const std::string& file, const std::string& value) {
    std::filesystem::create_directories(root_ / dir);
    std::ofstream(root_ / dir / file) << value << "\n";
  }
  int64_t read(const std::string& proc_self_cgroup) { return cgroup_memory_limit(proc_self_cgroup, root_.string()); }
  int64_t cpu(const std::string& proc_self_cgroup) { return cgroup_cpu_limit_millis(proc_self_cgroup, root_.string()); }
  std::filesystem::path root_;
};

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr const char* kV1Unlimited = "9223372036854771712";

// A systemd unit or Slurm job on a cgroup v2 host: the job's own group says "max", its parent
// sets the limit, and the hierarchy's root has no memory.max at all.
TEST_F(CgroupTree, V2TakesTheSmallestLimitOnThePathToTheRoot) {
  limit("system.slice/job.scope", "memory.max", "max");
  limit("system.slice", "memory.max", std::to_string(4 * kGiB));
  EXPECT_EQ(read("0::/system.slice/job.scope\n"), 4 * kGiB);
  limit("system.slice/job.scope", "memory.max", std::to_string(3 * kGiB));
  EXPECT_EQ(read("0::/system.slice/job.scope\n"), 3 * kGiB);
}

// cgroup v1 (this project's own CI machines): the memory controller's line names the group, the
// root's value is the kernel's "unlimited", and the controller may share its hierarchy.
TEST_F(CgroupTree, V1ReadsTheMemoryControllersGroup) {
  limit("memory", "memory.limit_in_bytes", kV1Unlimited);
  limit("memory/slurm/uid_1/job_2", "memory.limit_in_bytes", std::to_string(2 * kGiB));
  const std::string text = "9:name=systemd:/\n4:memory:/slurm/uid_1/job_2\n1:cpu:/\n0::/\n";
  EXPECT_EQ(read(text), 2 * kGiB);
  EXPECT_EQ(read("3:cpu,memory:/slurm/uid_1/job_2\n"), 2 * kGiB);
  EXPECT_EQ(read("4:memory:/\n"), 9223372036854771712);  // usable_memory_bytes takes physical below it
}

// In a container without its own cgroup namespace the path names the host's hierarchy, which the
// container does not see: its own limit is at the mount root.
TEST_F(CgroupTree, InvisibleLevelsAreSkippedAndTheMountRootCounts) {
  limit("memory", "memory.limit_in_bytes", std::to_string(kGiB));
  EXPECT_EQ(read("4:memory:/docker/0123abcd\n"), kGiB);
  limit("", "memory.max", std::to_string(5 * kGiB));
  EXPECT_EQ(read("0::/docker/0123abcd\n"), 5 * kGiB);
  EXPECT_EQ(read("4:memory:/docker/0123abcd\n0::/\n"), kGiB);  // hybrid: the tighter of both
}

TEST_F(CgroupTree, NoMemoryLimitWhereNothingSetsOne) {
  EXPECT_EQ(read(""), -1);                     // no control groups (or /proc unreadable)
  EXPECT_EQ(read("0::/user.slice\n"), -1);     // no files
  limit("user.slice", "memory.max", "max");
  EXPECT_EQ(read("0::/user.slice\n"), -1);
  limit("user.slice", "memory.max", "12abc");  // malformed values are no limit, not a crash
  EXPECT_EQ(read("0::/user.slice\n"), -1);
  limit("user.slice", "memory.max", "");
  EXPECT_EQ(read("0::/user.slice\n"), -1);
  limit("user.slice", "memory.max", "-5");
  EXPECT_EQ(read("0::/user.slice\n"), -1);
  EXPECT_EQ(read("garbage\n::\n0:memory\n4:memory:relative/path\n"), -1);
  limit("user.slice", "memory.max", std::to_string(kGiB));
  EXPECT_EQ(read("0::/user.slice/\n"), kGiB);  // a trailing slash names the same group
}

// `docker run --cpus 2.5` on cgroup v2: the container's cpu.max at its root, in microseconds of CPU
// time per period; a parent's tighter quota wins.
TEST_F(CgroupTree, V2CpuQuotaInThousandthsOfACpu) {
  limit("", "cpu.max", "250000 100000");
  EXPECT_EQ(cpu("0::/\n"), 2500);
  limit("user.slice/job", "cpu.max", "max 100000");
  limit("user.slice", "cpu.max", "50000 50000");
  EXPECT_EQ(cpu("0::/user.slice/job\n"), 1000);
}

// cgroup v1's quota and period live in two files of the cpu controller's group; -1 is no quota.
TEST_F(CgroupTree, V1CpuQuotaFromQuotaAndPeriod) {
  limit("cpu", "cpu.cfs_quota_us", "-1");
  limit("cpu", "cpu.cfs_period_us", "100000");
  EXPECT_EQ(cpu("1:cpu:/\n"), -1);
  limit("cpu/slurm/job_7", "cpu.cfs_quota_us", "400000");
  limit("cpu/slurm/job_7", "cpu.cfs_period_us", "100000");
  EXPECT_EQ(cpu("2:cpu,cpuacct:/slurm/job_7\n4:memory:/slurm/job_7\n"), 4000);
  EXPECT_EQ(read("2:cpu,cpuacct:/slurm/job_7\n"), -1);  // a cpu group says nothing about memory
  EXPECT_EQ(cpu("4:memory:/slurm/job_7\n"), -1);        // and a memory group nothing about CPUs
}

// A v1 hierarchy mounted under the name of all its controllers, without the per-controller link
// distributions add.
TEST_F(CgroupTree, V1HierarchyUnderItsControllersName) {
  limit("cpu,cpuacct/batch", "cpu.cfs_quota_us", "150000");
  limit("cpu,cpuacct/batch", "cpu.cfs_period_us", "100000");
  EXPECT_EQ(cpu("3:cpu,cpuacct:/batch\n"), 1500);
  limit("cpu/batch", "cpu.cfs_quota_us", "300000");  // with the link (here a directory), it is read
  limit("cpu/batch", "cpu.cfs_period_us", "100000");
  EXPECT_EQ(cpu("3:cpu,cpuacct:/batch\n"), 3000);
}

TEST_F(CgroupTree, NoCpuLimitWhereNothingSetsOne) {
  EXPECT_EQ(cpu(""), -1);
  limit("", "cpu.max", "max 100000");
  EXPECT_EQ(cpu("0::/\n"), -1);
  for (const char* bad : {"", "100000", "abc 100000", "100000 0", "1 2 3"}) {
    limit("", "cpu.max", bad);
    EXPECT_EQ(cpu("0::/\n"), -1) << "cpu.max '" << bad << "'";
  }
  limit("", "cpu.max", "9223372036854775807 100000");  // too large to scale: no overflow, no limit
  EXPECT_EQ(cpu("0::/\n"), -1);
  limit("", "cpu.max", "9000000000000000 1");  // absurd but representable: a huge limit
  EXPECT_EQ(cpu("0::/\n"), 9000000000000000000);
  limit("cpu", "cpu.cfs_quota_us", "200000");  // a quota without its period
  EXPECT_EQ(cpu("1:cpu:/\n"), -1);
}

// This process's own values stay within the machine's, whatever groups this machine has.
TEST(MachineLimits, ThisProcessWithinTheMachine) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  ASSERT_GT(usable_memory_bytes(), 0);
  if (pages > 0 && page > 0) {
    EXPECT_LE(usable_memory_bytes(), static_cast<int64_t>(pages) * page);
  }
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  EXPECT_GE(usable_cpus(), 1);
  EXPECT_LE(usable_cpus(), CPU_COUNT(&set));
}
