// What the launcher tells a rank through its environment, read the same way for mpirun (Open MPI),
// srun (Slurm, with --mpi=pmix or pmi2) and MPICH's mpiexec (PMI): the rank, the world size, the
// rank's place among the ranks of its machine, and the CPUs the launcher gave each task. MPI is
// the authority on ranks once initialised (the communicator); this is what the launcher meant,
// read before MPI starts and beside it: the CPUs per task (srun --cpus-per-task) decide a rank's
// threads, and a Slurm step of several tasks without an MPI plug-in is caught before every task
// trains alone.
#pragma once
#include <functional>
#include <string>

namespace duet::dist {

struct LaunchEnv {
  std::string launcher;     // "mpirun", "srun", "mpiexec (PMI)", or "" when none started this process
  int rank = -1, size = -1;  // -1: not given
  int local_rank = -1, local_size = -1;
  int node = -1, nodes = -1;  // this task's machine among the job's (Slurm's SLURM_NODEID, SLURM_NNODES)
  int cpus_per_task = 0;      // 0: not given (SLURM_CPUS_PER_TASK)
  bool mpi = false;           // an MPI launcher's or plug-in's variables are present (MPI can start)
};

// `get(name)` returns a variable's value or nullptr (std::getenv by default; tests pass their own).
using EnvLookup = std::function<const char*(const char*)>;
LaunchEnv launch_env(const EnvLookup& get);
LaunchEnv launch_env();

// Slurm's "2(x3),1" (tasks per node, as SLURM_TASKS_PER_NODE writes them) -> the count on node
// `node` (0-based), or -1 when the text does not say.
int slurm_tasks_on_node(const std::string& tasks_per_node, int node);

}  // namespace duet::dist
