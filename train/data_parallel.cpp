// Data-parallel glue of `duet train` (see data_parallel.h).
#include "train/data_parallel.h"
#include <unistd.h>
#include <algorithm>
#include <cstdlib>
#include <map>
#include <streambuf>
#include <fmt/format.h>
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/machine_limits.h"
#include "distributed/launcher.h"

namespace duet::app {

int rank_thread_share(int machine_cores, int quota, int bound_cores, int local_ranks) {
  // The ranks of one machine share its cores, and the CPU quota of the control group they run in.
  const int cores = quota > 0 ? std::min(machine_cores, quota) : machine_cores;
  const int share = std::max(1, cores / std::max(1, local_ranks));
  // mpirun binds each of 2 or fewer ranks to one core by default, and more threads than that
  // would share it.
  return std::max(1, std::min(share, bound_cores));
}

int threads_per_rank(const dist::Communicator& comm, std::string* why) {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const int bound = usable_cpus();  // the affinity mask (the launcher's binding), within the quota
  const int cores = online > 0 ? static_cast<int>(online) : bound;
  int n = rank_thread_share(cores, cpu_quota(), bound, comm.local_size());
  if (why) *why = fmt::format("{} cores / {} rank{} here{}", std::min(cores, bound), comm.local_size(),
                              comm.local_size() == 1 ? "" : "s", bound < cores ? ", bound" : "");
  const int per_task = dist::launch_env().cpus_per_task;  // srun --cpus-per-task
  if (per_task > 0 && per_task < n) {
    n = per_task;
    if (why) *why = fmt::format("SLURM_CPUS_PER_TASK={}", per_task);
  }
  return n;
}

int rank_gpu(int local_rank, int visible_gpus) {
  DUET_CHECK(visible_gpus > 0,
             "--device cuda: local rank {} sees no CUDA device (check the driver, CUDA_VISIBLE_DEVICES and the "
             "launcher's GPU binding, e.g. Slurm's --gpus-per-task)",
             local_rank);
  // A launcher that gives each rank its own GPU (Slurm's --gpus-per-task=1, a per-rank
  // CUDA_VISIBLE_DEVICES) shows every rank one device, its own, as cuda:0; one that shows them all
  // leaves the choice to the local rank. The modulo serves both, and shares GPUs round robin when
  // there are more local ranks than GPUs.
  return local_rank % visible_gpus;
}

GlobalOptions options_for_rank(const dist::Communicator& comm, GlobalOptions g) {
  if (comm.size() == 1) return g;
  if (g.threads == 0 && std::getenv("OMP_NUM_THREADS") == nullptr) g.threads = threads_per_rank(comm);
  if (g.device == "cuda")
    g.device = fmt::format("cuda:{}", rank_gpu(comm.local_rank(), device_count(DeviceType::cuda)));
  return g;
}

std::string rank_layout(dist::Communicator& comm, int asked_threads, int threads) {
  if (comm.size() == 1) return "";
  std::string threads_why = asked_threads > 0 ? "--threads" : std::getenv("OMP_NUM_THREADS") ? "OMP_NUM_THREADS" : "";
  if (threads_why.empty()) threads_per_rank(comm, &threads_why);
  // Each rank's line: host, local rank, threads and why, tab-separated; rank 0 groups them by host.
  const std::vector<std::string> all = comm.gather(
      fmt::format("{}\t{}\t{}\t{}", comm.hosts()[static_cast<size_t>(comm.rank())], comm.local_rank(), threads, threads_why), 0);
  if (comm.rank() != 0) return "";
  struct Host {
    std::string name;
    std::vector<std::string> ranks, locals, threads;
  };
  std::vector<Host> hosts;
  for (size_t r = 0; r < all.size(); ++r) {
    std::vector<std::string> f;
    for (size_t start = 0;;) {
      const size_t tab = all[r].find('\t', start);
      f.push_back(all[r].substr(start, tab == std::string::npos ? std::string::npos : tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    f.resize(4);
    auto it = std::find_if(hosts.begin(), hosts.end(), [&](const Host& h) { return h.name == f[0]; });
    if (it == hosts.end()) it = hosts.insert(hosts.end(), Host{f[0], {}, {}, {}});
    it->ranks.push_back(std::to_string(r));
    it->locals.push_back(f[1]);
    const std::string t = f[2] + (f[3].empty() ? "" : " (" + f[3] + ")");
    if (std::find(it->threads.begin(), it->threads.end(), t) == it->threads.end()) it->threads.push_back(t);
  }
  const auto join = [](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + v[i];
    return s;
  };
  std::string line = fmt::format("ranks on {} host{}:", hosts.size(), hosts.size() == 1 ? "" : "s");
  for (size_t i = 0; i < hosts.size(); ++i) {
    const Host& h = hosts[i];
    line += fmt::format("{} {}: rank{} {} (local {}), threads {}", i ? ";" : "", h.name, h.ranks.size() == 1 ? "" : "s",
                        join(h.ranks), join(h.locals), join(h.threads));
  }
  return line + "\n";
}

namespace {
// "optim.lr" -> "--lr": the command-line option a config key comes from, where the names differ.
std::string option_name(const std::string& key) {
  static const std::map<std::string, std::string> renamed{
      {"model.name", "--model"},          {"data.dataset", "--dataset"},     {"data.path", "--data"},
      {"optim.step_epochs", "--lr-step-epochs"}, {"optim.milestone_epochs", "--lr-milestones"},
      {"optim.gamma", "--lr-gamma"},      {"optim.warmup_start_factor", "--warmup-start"},
      {"data.synthetic_classes", "--classes"}, {"data.no_augment", "--no-augment"}};
  if (const auto it = renamed.find(key); it != renamed.end()) return it->second;
  std::string leaf = key.substr(key.rfind('.') + 1);
  std::replace(leaf.begin(), leaf.end(), '_', '-');
  return "--" + leaf;
}

void flatten(const nlohmann::json& j, const std::string& prefix, dist::Settings& out) {
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) flatten(v, prefix.empty() ? k : prefix + "." + k, out);
    return;
  }
  out.emplace_back(option_name(prefix), j.dump());
}

class NullBuf : public std::streambuf {
protected:
  int overflow(int c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};
}  // namespace

dist::Settings run_settings(const TrainConfig& c, const GlobalOptions& g) {
  dist::Settings s;
  flatten(stored_config(c), "", s);
  for (const auto& [name, value] :
       {std::pair<const char*, std::string>{"--device", g.device}, {"--backend", g.backend},
        {"--checkpoint", c.checkpoint}, {"--resume", c.resume}, {"--log", c.log},
        {"--bucket-mb", fmt::format("{}", c.bucket_mb)}, {"--stop-after-minutes", fmt::format("{}", c.stop_after_minutes)},
        {"--stop-after-epochs", std::to_string(c.stop_after_epochs)}, {"--profile", c.profile ? "on" : "off"},
        {"--sync-bn", c.sync_bn ? "on" : "off"}})
    s.emplace_back(name, value);
  return s;
}

std::ostream& null_stream() {
  static NullBuf buf;
  static std::ostream s(&buf);
  return s;
}

void abort_job(dist::Communicator& comm, const std::exception& e) {
  const bool ours = dynamic_cast<const Error*>(&e) != nullptr;
  comm.abort(fmt::format("duet: {}error on rank {} of {}: {}", ours ? "" : "internal ", comm.rank(), comm.size(), e.what()),
             ours ? 1 : 2);
  std::exit(1);  // not reached: abort() ends the process
}

}  // namespace duet::app
