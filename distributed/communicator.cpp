// The single-process communicator and the choice of the process's communicator.
#include "distributed/communicator.h"
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <fmt/format.h>
#include "distributed/launcher.h"
#include "engine/error.h"

namespace duet::dist {

#ifdef DUET_HAVE_MPI
std::unique_ptr<Communicator> make_mpi_communicator();  // mpi_communicator.cpp
#endif
#ifdef DUET_HAVE_NCCL
// MPI for the host, NCCL for GPU buffers (nccl_communicator.cpp).
std::unique_ptr<Communicator> make_nccl_communicator(std::unique_ptr<Communicator> host);
#endif

void Communicator::start_device_all_reduce_sum(void*, size_t, DType, Device device) {
  throw Error(fmt::format("{}: GPU collectives need NCCL, which this duet was built without (it comes with the CUDA "
                          "Toolkit; reconfigure with the CUDA backend and MPI found)",
                          device.str()));
}
void Communicator::wait_device(Device) {}

void SingleProcess::abort(const std::string& message, int exit_code) {
  std::cerr << message << std::endl;
  std::exit(exit_code);
}

std::string this_host() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "unknown host";
  return name;
}

std::string ranks_on_hosts(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // hosts in order of first appearance
  for (int r : ranks) {
    const std::string host = r >= 0 && static_cast<size_t>(r) < hosts.size() ? hosts[static_cast<size_t>(r)] : "?";
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == host; });
    if (it == groups.end()) groups.push_back({host, {r}});
    else it->second.push_back(r);
  }
  std::string s;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& [host, rs] = groups[i];
    s += i == 0 ? "" : i + 1 == groups.size() ? " and " : ", ";
    s += rs.size() == 1 ? "rank " : "ranks ";
    for (size_t k = 0; k < rs.size(); ++k) s += (k ? ", " : "") + std::to_string(rs[k]);
    s += " on " + host;
  }
  return s;
}

namespace {
const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}
// Open MPI's mpirun, PMIx (Open MPI 4+, Slurm's srun --mpi=pmix), PMI-1/2 (MPICH, srun --mpi=pmi2).
const char* launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"})
    if (const char* v = env(name)) return v;
  return nullptr;
}
}  // namespace

bool launched_by_mpi() { return launcher_size() != nullptr || env("PMIX_RANK") != nullptr || env("PMI_RANK") != nullptr; }

bool mpi_built_in() {
#ifdef DUET_HAVE_MPI
  return true;
#else
  return false;
#endif
}

Communicator& world() {
  static std::unique_ptr<Communicator> comm = []() -> std::unique_ptr<Communicator> {
    if (!launched_by_mpi()) {
      // srun without an MPI plug-in (--mpi=none, or a Slurm whose default is none) starts every
      // task as a process of its own: each would train the whole job alone.
      const LaunchEnv e = launch_env();
      DUET_CHECK(e.launcher != "srun" || e.size <= 1,
                 "srun started this process as task {} of {} without an MPI plug-in (no PMIx or PMI variables): every "
                 "task would train alone. Start it with srun --mpi=pmix (or --mpi=pmi2; `srun --mpi=list` shows "
                 "them), or with mpirun inside the allocation",
                 e.rank, e.size);
      return std::make_unique<SingleProcess>();
    }
#if defined(DUET_HAVE_NCCL)
    return make_nccl_communicator(make_mpi_communicator());
#elif defined(DUET_HAVE_MPI)
    return make_mpi_communicator();
#else
    const char* size = launcher_size();
    DUET_CHECK(size == nullptr || std::string(size) == "1",
               "this process was started by an MPI launcher for {} ranks, but this duet was built without MPI: every "
               "rank would train alone. Install openmpi-bin and libopenmpi-dev (./scripts/setup.sh) and reconfigure "
               "with -DDUET_MPI=ON, or start duet without mpirun",
               size ? size : "several");
    return std::make_unique<SingleProcess>();
#endif
  }();
  return *comm;
}

}  // namespace duet::dist
