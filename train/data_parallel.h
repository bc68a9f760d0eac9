// What `duet train` does differently when mpirun started it with several ranks: threads per rank,
// the run's settings every rank must share, and ending the whole job when one rank fails.
#pragma once
#include <exception>
#include <string>
#include <ostream>
#include <string>
#include "train/run_env.h"
#include "train/train_config.h"
#include "distributed/communicator.h"
#include "distributed/sync.h"

namespace duet::app {

// OpenMP threads for one of comm.local_size() ranks on this machine: its share of the cores, or of
// the control group's CPU quota where smaller (at least 1, at most the cores the launcher bound it
// to, and at most the CPUs per task Slurm gave it: SLURM_CPUS_PER_TASK), so the ranks do not
// oversubscribe them. `why`, when given, gets what decided ("2 cores / 2 ranks here").
int threads_per_rank(const dist::Communicator& comm, std::string* why = nullptr);
// The GPU index of local rank `local_rank` among the `visible_gpus` devices this process sees: the
// local rank modulo the count, so that a launcher that masks devices per rank (each rank sees only
// its own, as cuda:0) and one that shows every rank all of them both work. duet::Error when the rank
// sees none.
int rank_gpu(int local_rank, int visible_gpus);
// Its arithmetic: `machine_cores` (or `quota` where smaller and positive) split between
// `local_ranks`, at most `bound_cores`, at least 1.
int rank_thread_share(int machine_cores, int quota, int bound_cores, int local_ranks);
// `g` as one rank of several uses it: --threads set to threads_per_rank() unless --threads or
// OMP_NUM_THREADS already chose, and --device cuda (no index) made cuda:<rank_gpu(local rank)>, one
// GPU per rank on each machine, as torchrun's LOCAL_RANK convention has it. In one process, `g` as
// given.
GlobalOptions options_for_rank(const dist::Communicator& comm, GlobalOptions g);

// Where the ranks run and with how many threads, one line per host, gathered to rank 0 (a
// collective: every rank calls it; the others get ""):
//   ranks: duet-h1: ranks 0, 1 (local 0, 1), 1 thread each (2 cores / 2 ranks here); duet-h2: ...
// `asked_threads`: --threads as given (0: none); `threads`: the OpenMP threads this rank runs.
std::string rank_layout(dist::Communicator& comm, int asked_threads, int threads);

// The settings that must be equal on every rank: the whole TrainConfig (as stored in
// checkpoints) and the options that are not part of it, each named as on the command line.
dist::Settings run_settings(const TrainConfig& c, const GlobalOptions& g);

// A stream that drops everything: what ranks other than 0 print to.
std::ostream& null_stream();

// Prints "duet: error on rank R of W: <what>" and ends every rank of the job (MPI_Abort).
[[noreturn]] void abort_job(dist::Communicator& comm, const std::exception& e);

// Runs a command's body on this rank: `body(out)` in one process; under mpirun rank 0 prints to
// `out` and the others to null_stream(), and an error on any rank ends the whole job, since the
// other ranks would otherwise wait in their next collective forever.
template <class Body>
auto run_on_every_rank(dist::Communicator& comm, std::ostream& out, Body&& body) {
  if (comm.size() == 1) return body(out);
  try {
    return body(comm.rank() == 0 ? out : null_stream());
  } catch (const std::exception& e) {
    out.flush();
    abort_job(comm, e);
  }
}

}  // namespace duet::app
