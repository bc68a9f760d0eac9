// Several machines on one: duet's data-parallel runs across "hosts" that are network namespaces
// with their own addresses and hostnames (scripts/hosts.sh), Open MPI starting the ranks through
// an agent that enters a host where a cluster's would ssh into it; TCP between hosts, shared
// memory within one. tests/hosts/with_hosts.sh N brings N hosts up around this program and down
// after it (DUET_HOSTS_N tells it how many); ctest runs it that way (tests/CMakeLists.txt).
//
//   equivalence: resnet18_cifar on 2 ranks per host equals one process with the global batch
//     (--sync-bn, relative norm 1e-5, the single-machine bound), sharded eval and predict equal one
//     process exactly, a checkpoint rank 0 wrote on host 1 resumes exactly;
//   faults: a host's link cut, its ranks killed, its ranks stopped, the whole host frozen: the job
//     ends within --comm-timeout plus a few seconds with a message naming the host lost, the last
//     checkpoint loads, and no process is left on any host;
//   launchers: a hostfile with slots, --map-by, Slurm's variables.
#include <signal.h>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <thread>
#include <fmt/format.h>
#include "train/checkpoint.h"
#include "tests/dist_support.h"
#include "tests/test_support.h"

using namespace duet;
using namespace duet::testing;
namespace fs = std::filesystem;

namespace {
const std::string kHosts = std::string(DUET_SOURCE_DIR) + "/scripts/hosts.sh";
const std::string kDuet = DUET_CLI_PATH;

int hosts_up() {
  const char* n = std::getenv("DUET_HOSTS_N");
  return n ? std::atoi(n) : 0;
}

#define DUET_REQUIRE_HOSTS(n)                                                                                   \
  do {                                                                                                          \
    if (hosts_up() < (n)) {                                                                                     \
      const std::string why = fmt::format("needs {} hosts: run it through tests/hosts/with_hosts.sh {}", n, n); \
      if (std::getenv("DUET_REQUIRE_HOSTS")) FAIL() << "DUET_REQUIRE_HOSTS is set, but " << why;               \
      GTEST_SKIP() << why;                                                                                      \
    }                                                                                                           \
  } while (0)

// mpirun on host 1 over the hosts (scripts/hosts.sh mpirun: hostfile, agent, TCP subnet).
std::string across(int np, const std::string& args, const std::string& mpirun_options = "") {
  return fmt::format("{} mpirun {} -np {} --bind-to none {}", kHosts, mpirun_options, np, args);
}

std::string host_name(int i) { return fmt::format("{}-h{}", std::getenv("DUET_HOSTS_PREFIX") ? std::getenv("DUET_HOSTS_PREFIX") : "duet", i); }

// The processes on host i, "pid comm" per line (ip netns pids).
std::vector<std::pair<int, std::string>> processes_on(int i) {
  std::vector<std::pair<int, std::string>> v;
  const Proc p = sh(fmt::format("ip netns pids {}", host_name(i)), 10);
  std::istringstream in(p.out);
  for (int pid = 0; in >> pid;) {
    std::string comm = read_text(fmt::format("/proc/{}/comm", pid));
    if (!comm.empty() && comm.back() == '\n') comm.pop_back();
    v.emplace_back(pid, comm);
  }
  return v;
}
int duet_ranks_on(int i) {
  const auto ps = processes_on(i);
  return static_cast<int>(std::count_if(ps.begin(), ps.end(), [](const auto& p) { return p.second == "duet"; }));
}
std::string processes_text(int hosts) {
  std::string s;
  for (int i = 1; i <= hosts; ++i) {
    s += host_name(i) + ":";
    for (const auto& [pid, comm] : processes_on(i)) s += fmt::format(" {} {}", pid, comm);
    s += "\n";
  }
  return s;
}

// "duet eval" output without its timing and its rank count: what one process and N ranks share.
std::string eval_result(std::string out) {
  const size_t timing = out.find("  (");
  if (timing != std::string::npos) out.erase(timing, out.find(')', timing) + 1 - timing);
  const size_t ranks = out.find(" | sharded over");
  if (ranks != std::string::npos) out.erase(ranks, out.find('\n', ranks) - ranks);
  return out;
}
}  // namespace

// 2 ranks per host train resnet18_cifar (with --sync-bn, so that batch norm sees the global batch)
// for 3 steps and end with one process's weights; sharded `duet eval` of the result prints what one
// process prints. The learning rate is small (0.001) so that 3 steps stay where f32 rounding is not
// amplified: one process run with 1 and with 2 threads differs by about 1e-6 there (and by 2e-5 at
// 0.01, where 3 steps across hosts differ from one process by 8e-5, as 2 ranks on one machine do).
TEST(Hosts, TrainingAndEvalEqualOneProcess) {
  DUET_REQUIRE_HOSTS(2);
  const int hosts = hosts_up(), np = 2 * hosts, b = 8;
  const std::string dir = temp_dir("hosts_train");
  const std::string common = fmt::format(
      "train --model resnet18_cifar --dataset synthetic --train-size {} --test-size 40 --epochs 1 --optimizer sgd --lr 0.001 "
      "--workers 0 --sync-bn --log-every 1",
      3 * np * b);
  const Proc r = sh(across(np, fmt::format("{} {} --threads 1 --batch {} --checkpoint {}/n.safetensors", kDuet, common, b, dir)), 600);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, fmt::format("{} ranks, 2 on this machine", np))) << r.out;
  EXPECT_TRUE(contains(r.out, fmt::format("ranks on {} hosts: {}: ranks 0, 1 (local 0, 1)", hosts, host_name(1)))) << r.out;
  EXPECT_TRUE(contains(r.out, fmt::format("{}: ranks {}, {} (local 0, 1)", host_name(hosts), np - 2, np - 1))) << r.out;
  const Proc s = sh(fmt::format("{} {} --threads 2 --batch {} --checkpoint {}/one.safetensors", kDuet, common, np * b, dir), 600);
  ASSERT_EQ(s.rc, 0) << s.out;
  const Proc s1 = sh(fmt::format("{} {} --threads 1 --batch {} --checkpoint {}/one1.safetensors", kDuet, common, np * b, dir), 600);
  ASSERT_EQ(s1.rc, 0) << s1.out;
  const app::Checkpoint many = app::read_checkpoint(dir + "/n.safetensors");
  const app::Checkpoint one = app::read_checkpoint(dir + "/one.safetensors");
  // One process's own rounding: the same run with 1 thread instead of 2.
  const double noise = relative_l2_difference(app::read_checkpoint(dir + "/one1.safetensors").model, one.model);
  const double norm = relative_l2_difference(many.model, one.model);
  const double elementwise = max_relative_difference(many.model, one.model);
  EXPECT_LE(norm, 1e-5) << "the single-machine --sync-bn bound";
  EXPECT_EQ(many.state.step, one.state.step);
  EXPECT_EQ(many.state.config["world_size"], np);
  std::cout << fmt::format("[ measure  ] resnet18_cifar, {} hosts x 2 ranks, 3 steps, --sync-bn: relative norm of the "
                           "difference {:.3g}, max relative difference {:.3g} (one process, 1 thread against 2: {:.3g}); "
                           "{:.1f} s across hosts\n",
                           hosts, norm, elementwise, noise, r.seconds);
  // Sharded evaluation across the hosts: the same loss and accuracy to the last digit.
  const std::string eval = fmt::format("{} eval {}/n.safetensors --batch 8 --workers 0 --threads 1", kDuet, dir);
  const Proc e1 = sh(eval, 300);
  ASSERT_EQ(e1.rc, 0) << e1.out;
  const Proc en = sh(across(np, eval), 300);
  ASSERT_EQ(en.rc, 0) << en.out;
  EXPECT_TRUE(contains(en.out, fmt::format("sharded over {} ranks", np))) << en.out;
  EXPECT_EQ(eval_result(en.out), eval_result(e1.out));
  std::cout << fmt::format("[ measure  ] duet eval across {} hosts prints what one process prints: {}\n", hosts,
                           eval_result(en.out) == eval_result(e1.out) ? "yes" : "no");
}

// `duet predict` sharded over the hosts writes the file one process writes, byte for byte.
TEST(Hosts, PredictEqualsOneProcess) {
  DUET_REQUIRE_HOSTS(2);
  DUET_REQUIRE_DATA_DIR();
  const int np = 2 * hosts_up();
  const std::string dir = temp_dir("hosts_predict");
  const std::string photos = duet::testing::data_dir() + "/cats_dogs/test";
  const Proc t = sh(fmt::format("{} train --model small_cnn --width-mult 0.25 --dataset folder --data {}/cats_dogs "
                                "--image-size 16 --epochs 1 --batch 32 --threads 2 --checkpoint {}/ck.safetensors",
                                kDuet, duet::testing::data_dir(), dir),
                    300);
  ASSERT_EQ(t.rc, 0) << t.out;
  const std::string predict = fmt::format("{} predict -c {}/ck.safetensors {} --batch 16 --top 2 --threads 1", kDuet, dir, photos);
  const Proc one = sh(fmt::format("{} --out {}/one.csv", predict, dir));
  ASSERT_EQ(one.rc, 0) << one.out;
  const Proc many = sh(across(np, fmt::format("{} --out {}/many.csv", predict, dir)), 300);
  ASSERT_EQ(many.rc, 0) << many.out;
  EXPECT_TRUE(contains(many.out, fmt::format("sharded over {} ranks", np))) << many.out;
  const std::string a = read_text(dir + "/one.csv"), b = read_text(dir + "/many.csv");
  EXPECT_EQ(std::count(a.begin(), a.end(), '\n'), 301);
  EXPECT_EQ(b, a);
  std::cout << fmt::format("[ measure  ] duet predict across {} hosts ({} ranks) writes one process's file: {}\n",
                           hosts_up(), np, a == b ? "byte for byte" : "NO");
}

// A checkpoint rank 0 wrote on host 1 (the hosts share this file system) resumes on the same
// number of ranks across the hosts and ends exactly where an uninterrupted run does.
TEST(Hosts, CheckpointOfHostOneResumesExactly) {
  DUET_REQUIRE_HOSTS(2);
  const int np = 2 * hosts_up();
  const std::string dir = temp_dir("hosts_resume");
  const std::string common = fmt::format(
      "{} train --model mlp --width-mult 0.25 --dataset synthetic --train-size {} --test-size 40 --batch 10 "
      "--optimizer sgd --workers 0 --threads 1 --epochs 2",
      kDuet, 6 * 10 * np);
  const Proc whole = sh(across(np, fmt::format("{} --checkpoint {}/whole.safetensors", common, dir)));
  ASSERT_EQ(whole.rc, 0) << whole.out;
  const Proc first = sh(across(np, fmt::format("{} --stop-after-epochs 1 --checkpoint {}/part.safetensors", common, dir)));
  ASSERT_EQ(first.rc, 0) << first.out;
  EXPECT_TRUE(contains(first.out, fmt::format("{}: ranks 0, 1", host_name(1)))) << "rank 0 is on host 1:\n" << first.out;
  const Proc rest = sh(across(np, fmt::format("{} --checkpoint {}/part.safetensors --resume {}/part.safetensors", common, dir, dir)));
  ASSERT_EQ(rest.rc, 0) << rest.out;
  const double d = max_relative_difference(app::read_checkpoint(dir + "/part.safetensors").model,
                                           app::read_checkpoint(dir + "/whole.safetensors").model);
  EXPECT_EQ(d, 0.0);
  std::cout << fmt::format("[ measure  ] resumed across {} hosts: max difference from the uninterrupted run {:.3g}\n",
                           hosts_up(), d);
}

// ---- faults ----------------------------------------------------------------------------------
namespace {
enum class Fault { cut, kill, stop, freeze };
const char* fault_name(Fault f) {
  return f == Fault::cut ? "link cut" : f == Fault::kill ? "ranks killed" : f == Fault::stop ? "ranks stopped" : "host frozen";
}

struct FaultRun {
  Proc mpirun;
  double healthy_ranks_end = -1;  // seconds from the fault until host 1's ranks were gone
  double lost_ranks_end = -1;     // ... host 2's
  double job_end = -1;            // ... mpirun's end
  int64_t checkpoint_step = -1;
};

// A long run of 2 ranks per host with --comm-timeout 3; once the first epoch's checkpoint is
// written, the fault hits host 2. Times are measured from the fault.
FaultRun run_with_fault(Fault fault, const std::string& dir) {
  const int np = 2 * hosts_up();
  const std::string cmd = across(np, fmt::format("{} train --model mlp --dataset synthetic --train-size 512 --test-size 16 "
                                                 "--batch 8 --epochs 100000 --workers 0 --threads 1 --comm-timeout 3 "
                                                 "--log {}/log.jsonl --checkpoint {}/ck.safetensors",
                                                 kDuet, dir, dir));
  FaultRun f;
  std::thread runner([&] { f.mpirun = sh(cmd, 120); });
  const auto t0 = std::chrono::steady_clock::now();
  bool started = false;
  while (!started && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
    started = fs::exists(dir + "/ck.safetensors") && fs::exists(dir + "/log.jsonl") && fs::file_size(dir + "/log.jsonl") > 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!started) {
    ADD_FAILURE() << "the ranks did not start training";
    runner.join();
    return f;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // mid-epoch: inside a step's collectives
  const auto hit = std::chrono::steady_clock::now();
  std::vector<int> frozen;
  switch (fault) {
    case Fault::cut: sh(fmt::format("{} cut h2", kHosts), 10); break;
    case Fault::kill:
    case Fault::stop:
    case Fault::freeze:
      for (const auto& [pid, comm] : processes_on(2))
        if (fault == Fault::freeze || comm == "duet") {
          ::kill(pid, fault == Fault::kill ? SIGKILL : SIGSTOP);
          frozen.push_back(pid);
        }
      break;
  }
  const auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - hit).count(); };
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    while (!done) {
      if (f.healthy_ranks_end < 0 && duet_ranks_on(1) == 0) f.healthy_ranks_end = since();
      // A frozen host resumes once the healthy hosts' ranks have ended (a host that comes back):
      // its processes cannot end while they are stopped.
      if (fault == Fault::freeze && f.healthy_ranks_end >= 0 && !frozen.empty()) {
        for (int pid : frozen) ::kill(pid, SIGCONT);
        frozen.clear();
      }
      if (f.lost_ranks_end < 0 && duet_ranks_on(2) == 0) f.lost_ranks_end = since();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    // Host 1's ranks end moments before mpirun does; on a busy machine that can fall between
    // two looks above. Look on (bounded) so their end is measured, at worst as seen after mpirun's.
    for (int i = 0; f.healthy_ranks_end < 0 && i < 200; ++i) {
      if (duet_ranks_on(1) == 0) f.healthy_ranks_end = since();
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  runner.join();
  f.job_end = since();
  done = true;
  watcher.join();
  for (int pid : frozen) ::kill(pid, SIGCONT);
  if (fault == Fault::cut) sh(fmt::format("{} heal h2", kHosts), 10);
  return f;
}

// The job ended in bounded time, non-zero, naming what was lost; the checkpoint loads; no process
// is left on any host.
void expect_clean_end(Fault fault, const FaultRun& f, const std::string& dir, double ranks_bound, double job_bound) {
  const int hosts = hosts_up();
  EXPECT_NE(f.mpirun.rc, 0) << f.mpirun.out;
  EXPECT_NE(f.mpirun.rc, 124) << "mpirun still ran at the timeout:\n" << f.mpirun.out;
  EXPECT_GE(f.healthy_ranks_end, 0);
  EXPECT_LE(f.healthy_ranks_end, ranks_bound) << f.mpirun.out;
  EXPECT_LE(f.job_end, job_bound) << f.mpirun.out;
  // Nothing left on any host once mpirun has ended (a moment for the kernel to reap).
  std::string left;
  for (int i = 0; i < 40; ++i) {
    left.clear();
    for (int h = 1; h <= hosts; ++h)
      if (!processes_on(h).empty()) left = processes_text(hosts);
    if (left.empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(left, "") << "processes left on the hosts";
  // The last checkpoint is whole: it loads, and `duet eval` runs on it.
  const app::Checkpoint ck = app::read_checkpoint(dir + "/ck.safetensors");
  EXPECT_GT(ck.state.step, 0);
  const Proc e = sh(fmt::format("{} eval {}/ck.safetensors --workers 0 --threads 1", kDuet, dir), 60);
  EXPECT_EQ(e.rc, 0) << e.out;
  // Host 2's ranks may outlast mpirun (cut off, they end at their own timeout or by their daemon);
  // the check of leftovers above waits for them, so they have no time of their own here.
  const std::string lost_end = f.lost_ranks_end >= 0 ? fmt::format("{:.2f} s", f.lost_ranks_end) : "after mpirun's end";
  std::cout << fmt::format("[ measure  ] {}: host 1's ranks ended {:.2f} s after the fault, host 2's {}, mpirun "
                           "{:.2f} s (exit {}); checkpoint at step {} loads; processes left: {}\n",
                           fault_name(fault), f.healthy_ranks_end, lost_end, f.job_end, f.mpirun.rc,
                           ck.state.step, left.empty() ? "none" : left);
  std::string messages;
  for (std::istringstream in(f.mpirun.out); std::getline(in, messages);)
    if (contains(messages, "duet: rank") || contains(messages, "mpirun noticed") || contains(messages, "Remote daemon"))
      std::cout << "[ message  ] " << messages << "\n";
}
}  // namespace

// Host 2 falls off the network mid-step: host 1's ranks end at --comm-timeout naming host 2's
// ranks, host 2's ranks end by their own timeout, and mpirun notices the lost daemon (TCP keepalive).
TEST(Hosts, LinkCutEndsTheJobNamingTheHost) {
  DUET_REQUIRE_HOSTS(2);
  const std::string dir = temp_dir("hosts_cut");
  const FaultRun f = run_with_fault(Fault::cut, dir);
  expect_clean_end(Fault::cut, f, dir, 3 + 4, 3 + 12);  // mpirun: TCP keepalive or retries, slower on a busy machine
  EXPECT_TRUE(contains(f.mpirun.out, "waited 3 s in an all-reduce")) << f.mpirun.out;
  EXPECT_TRUE(contains(f.mpirun.out, fmt::format("from ranks 2, 3 on {}", host_name(2)))) << f.mpirun.out;
}

// Host 2's ranks are killed: Open MPI sees them die and ends the job, naming the rank and host.
TEST(Hosts, KilledRanksEndTheJob) {
  DUET_REQUIRE_HOSTS(2);
  const std::string dir = temp_dir("hosts_kill");
  const FaultRun f = run_with_fault(Fault::kill, dir);
  expect_clean_end(Fault::kill, f, dir, 6, 8);
  EXPECT_TRUE(contains(f.mpirun.out, fmt::format("on node {} exited on signal 9", host_name(2)))) << f.mpirun.out;
}

// Host 2's ranks hang (SIGSTOP; its Open MPI daemon still runs): the others end at --comm-timeout
// naming them, and mpirun ends the stopped ones.
TEST(Hosts, StoppedRanksEndTheJobAfterTheCommTimeout) {
  DUET_REQUIRE_HOSTS(2);
  const std::string dir = temp_dir("hosts_stop");
  const FaultRun f = run_with_fault(Fault::stop, dir);
  expect_clean_end(Fault::stop, f, dir, 3 + 4, 3 + 8);
  EXPECT_TRUE(contains(f.mpirun.out, "waited 3 s in an all-reduce")) << f.mpirun.out;
  EXPECT_TRUE(contains(f.mpirun.out, fmt::format("from ranks 2, 3 on {}", host_name(2)))) << f.mpirun.out;
}

// The whole of host 2 freezes (every process on it stopped, Open MPI's daemon too): host 1's ranks
// end at --comm-timeout naming host 2's; mpirun waits for the frozen daemon, and once the host
// resumes everything ends at once.
TEST(Hosts, FrozenHostEndsTheJobWhenItResumes) {
  DUET_REQUIRE_HOSTS(2);
  const std::string dir = temp_dir("hosts_freeze");
  const FaultRun f = run_with_fault(Fault::freeze, dir);
  expect_clean_end(Fault::freeze, f, dir, 3 + 4, 3 + 12);
  EXPECT_TRUE(contains(f.mpirun.out, fmt::format("from ranks 2, 3 on {}", host_name(2)))) << f.mpirun.out;
}

// ---- launchers -------------------------------------------------------------------------------
// A hostfile with slots and --map-by: which ranks land on which host, their local ranks, and the
// threads each rank takes from what its host has, printed once by rank 0.
TEST(Hosts, HostfileSlotsAndMapBy) {
  DUET_REQUIRE_HOSTS(2);
  const std::string args = fmt::format("{} train --model mlp --width-mult 0.25 --dataset synthetic --train-size 64 "
                                       "--test-size 16 --batch 8 --epochs 1 --workers 0",
                                       kDuet);
  // By slot (the default): ranks 0, 1 on host 1, ranks 2, 3 on host 2; each host's cores shared by its 2 ranks.
  const Proc slot = sh(across(4, args), 120);
  ASSERT_EQ(slot.rc, 0) << slot.out;
  const int cores = static_cast<int>(std::thread::hardware_concurrency());
  const std::string share = fmt::format("threads {} ({} cores / 2 ranks here)", std::max(1, cores / 2), cores);
  EXPECT_TRUE(contains(slot.out, fmt::format("ranks on 2 hosts: {}: ranks 0, 1 (local 0, 1), {}", host_name(1), share))) << slot.out;
  // Round robin over the hosts.
  const Proc node = sh(across(4, args, "--map-by node"), 120);
  ASSERT_EQ(node.rc, 0) << node.out;
  EXPECT_TRUE(contains(node.out, fmt::format("{}: ranks 0, 2 (local 0, 1)", host_name(1)))) << node.out;
  EXPECT_TRUE(contains(node.out, fmt::format("{}: ranks 1, 3 (local 0, 1)", host_name(2)))) << node.out;
  // One rank per host takes the host's cores.
  const Proc ppr = sh(across(2, args, "--map-by ppr:1:node"), 120);
  ASSERT_EQ(ppr.rc, 0) << ppr.out;
  EXPECT_TRUE(contains(ppr.out, fmt::format("{}: rank 0 (local 0), threads {} ({} cores / 1 rank here)", host_name(1), cores, cores)))
      << ppr.out;
  for (const Proc* p : {&slot, &node, &ppr}) {
    const size_t at = p->out.find("ranks on ");
    std::cout << "[ layout   ] " << p->out.substr(at, p->out.find('\n', at) - at) << "\n";
  }
}

// Slurm's variables as `srun --mpi=pmix --ntasks-per-node=1 --cpus-per-task=1` gives them (set by
// hand around each rank here, MPI itself started by mpirun): the CPUs per task decide the threads.
TEST(Hosts, SlurmCpusPerTaskDecideTheThreads) {
  DUET_REQUIRE_HOSTS(2);
  const std::string rank = fmt::format(
      "env SLURM_PROCID=\\$OMPI_COMM_WORLD_RANK SLURM_LOCALID=0 SLURM_NODEID=\\$OMPI_COMM_WORLD_RANK SLURM_NTASKS=2 "
      "SLURM_STEP_NUM_TASKS=2 SLURM_NNODES=2 SLURM_STEP_NUM_NODES=2 SLURM_TASKS_PER_NODE=1\\(x2\\) "
      "SLURM_STEP_TASKS_PER_NODE=1\\(x2\\) SLURM_CPUS_PER_TASK=1 {} train --model mlp --width-mult 0.25 --dataset "
      "synthetic --train-size 64 --test-size 16 --batch 8 --epochs 1 --workers 0",
      kDuet);
  const Proc r = sh(across(2, fmt::format("sh -c \"{}\"", rank), "--map-by ppr:1:node"), 120);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_TRUE(contains(r.out, fmt::format("{}: rank 0 (local 0), threads 1 (SLURM_CPUS_PER_TASK=1)", host_name(1)))) << r.out;
  EXPECT_TRUE(contains(r.out, fmt::format("{}: rank 1 (local 0), threads 1 (SLURM_CPUS_PER_TASK=1)", host_name(2)))) << r.out;
  const size_t at = r.out.find("ranks on ");
  std::cout << "[ layout   ] " << r.out.substr(at, r.out.find('\n', at) - at) << "\n";
}
