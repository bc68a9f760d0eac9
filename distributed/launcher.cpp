// The launchers' environment variables (see launcher.h). Open MPI's mpirun sets
// OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; srun sets SLURM_PROCID, SLURM_LOCALID,
// SLURM_STEP_NUM_TASKS (SLURM_NTASKS), SLURM_NODEID, SLURM_STEP_NUM_NODES (SLURM_NNODES),
// SLURM_STEP_TASKS_PER_NODE (SLURM_TASKS_PER_NODE) and, with --cpus-per-task, SLURM_CPUS_PER_TASK,
// plus PMIX_RANK (--mpi=pmix) or PMI_RANK/PMI_SIZE (--mpi=pmi2); MPICH's mpiexec sets PMI_* and
// MPI_LOCALRANKID.
#include "distributed/launcher.h"
#include <cstdlib>
#include <regex>

namespace duet::dist {

namespace {
int as_int(const char* v) {
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return end != nullptr && *end == '\0' && x >= 0 && x < (1L << 30) ? static_cast<int>(x) : -1;
}
int first_of(const EnvLookup& get, std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (const int v = as_int(get(n)); v >= 0) return v;
  return -1;
}
}  // namespace

int slurm_tasks_on_node(const std::string& text, int node) {
  // Comma-separated "count" or "count(xrepeat)" groups, one count per node in node order.
  static const std::regex group(R"(^(\d+)(?:\(x(\d+)\))?$)");
  int seen = 0;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string part = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    std::smatch m;
    if (!std::regex_match(part, m, group)) return -1;
    const int count = std::stoi(m[1]);
    const int repeat = m[2].matched ? std::stoi(m[2]) : 1;
    if (node < seen + repeat) return count;
    seen += repeat;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return -1;
}

LaunchEnv launch_env(const EnvLookup& get) {
  LaunchEnv e;
  const bool ompi = get("OMPI_COMM_WORLD_SIZE") != nullptr;
  const bool slurm = get("SLURM_PROCID") != nullptr && (get("SLURM_STEP_NUM_TASKS") || get("SLURM_NTASKS"));
  const bool pmix = get("PMIX_RANK") != nullptr, pmi = get("PMI_RANK") != nullptr;
  e.mpi = ompi || pmix || pmi;
  if (ompi) {
    e.launcher = "mpirun";
    e.rank = as_int(get("OMPI_COMM_WORLD_RANK"));
    e.size = as_int(get("OMPI_COMM_WORLD_SIZE"));
    e.local_rank = as_int(get("OMPI_COMM_WORLD_LOCAL_RANK"));
    e.local_size = as_int(get("OMPI_COMM_WORLD_LOCAL_SIZE"));
  } else if (slurm) {
    e.launcher = "srun";
    e.rank = as_int(get("SLURM_PROCID"));
    e.size = first_of(get, {"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS"});
    e.local_rank = as_int(get("SLURM_LOCALID"));
    e.node = as_int(get("SLURM_NODEID"));
    e.nodes = first_of(get, {"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"});
    for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
      if (const char* t = get(name); t != nullptr && e.node >= 0) {
        e.local_size = slurm_tasks_on_node(t, e.node);
        break;
      }
  } else if (pmix || pmi) {
    e.launcher = "mpiexec (PMI)";
    e.rank = first_of(get, {"PMIX_RANK", "PMI_RANK"});
    e.size = first_of(get, {"PMIX_SIZE", "PMI_SIZE"});
    e.local_rank = first_of(get, {"MPI_LOCALRANKID", "PMI_LOCAL_RANK"});
    e.local_size = first_of(get, {"MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"});
  }
  if (!e.launcher.empty()) {
    const int cpus = as_int(get("SLURM_CPUS_PER_TASK"));
    e.cpus_per_task = cpus > 0 ? cpus : 0;
  }
  return e;
}

LaunchEnv launch_env() {
  return launch_env([](const char* name) { return std::getenv(name); });
}

}  // namespace duet::dist
