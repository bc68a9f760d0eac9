// The collectives data-parallel training needs, behind a small interface: the trainer, the
// gradient reducer and sync batch norm talk to a Communicator, never to MPI. The engine sits below
// this part and knows none of it (the build forbids the include): a batch norm reaches the other
// ranks only through the hook that distributed/sync_batch_norm.h sets. Implementations: one process
// (every collective is the identity), MPI (distributed/mpi_communicator.cpp, built when MPI is
// found), and MPI with NCCL for GPU memory (distributed/nccl_communicator.cpp, built when the CUDA
// backend and MPI are).
//
// All ranks must call the collectives in the same order with the same sizes (MPI's rule). An
// implementation serialises its own calls, so two threads of one rank may use it (the gradient
// reducer's communication thread and the training thread), one call at a time.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "engine/device.h"
#include "engine/dtype.h"

namespace duet::dist {

// This machine's host name (gethostname).
std::string this_host();

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;        // 0 .. size-1
  virtual int size() const = 0;        // the world size
  virtual int local_rank() const = 0;  // among the ranks sharing this machine's memory
  virtual int local_size() const = 0;
  // Whether a second thread may call in while the first is inside a call (MPI_THREAD_SERIALIZED
  // or better was granted); the gradient reducer overlaps communication only then.
  virtual bool thread_safe() const = 0;
  virtual std::string describe() const = 0;  // "MPI (Open MPI v4.1.4), 2 ranks" for the run header
  // The machine each rank runs on, in rank order (MPI_Get_processor_name, gathered once): what
  // the run's layout and the messages about a lost rank name. One process: this machine's name.
  virtual std::vector<std::string> hosts() const { return std::vector<std::string>(static_cast<size_t>(size()), this_host()); }
  // Who carries this communicator's collectives on memory of `where`, as the profile's backend
  // column names a communication window (profiler::CommScope): "mpi", "nccl".
  virtual const char* transport(Device where) const {
    (void)where;
    return "comm";  // a communicator that names no transport (one process, a test's)
  }

  // In place: every rank ends with the element-wise sum over ranks.
  virtual void all_reduce_sum(float* data, size_t count) = 0;
  virtual void all_reduce_sum(double* data, size_t count) = 0;
  // Rank `root`'s bytes to everyone.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // One value per rank, in rank order, on every rank.
  virtual std::vector<uint64_t> all_gather(uint64_t value) = 0;
  virtual void barrier() = 0;
  // Every rank's bytes, in rank order, on rank `root` (the others get an empty list): reports
  // and traces that rank 0 writes for all.
  virtual std::vector<std::string> gather(const std::string& bytes, int root) = 0;
  // Ends every rank of the job (MPI_Abort) after printing `message` naming this rank; a single
  // process just exits. For an error one rank hit alone: the others would wait forever.
  [[noreturn]] virtual void abort(const std::string& message, int exit_code) = 0;
  // GPU buffers. Whether this communicator can sum memory of `device`: CPU memory always; a CUDA
  // device when duet was built with NCCL (distributed/nccl_communicator.cpp).
  virtual bool sums_on(Device device) const { return device.type == DeviceType::cpu; }
  // Queues the in-place sum over ranks of `count` elements of `dtype` at `data`, memory of the
  // CUDA device `device`, behind the work already queued on that device's compute stream, and
  // returns at once: the sum runs on a communication stream while the compute stream goes on.
  virtual void start_device_all_reduce_sum(void* data, size_t count, DType dtype, Device device);
  // The device's compute stream waits (on the GPU, not the host) for every sum started so far.
  virtual void wait_device(Device device);
  // A collective that has not completed after this many seconds ends the job (abort()), naming
  // this rank and the collective: a rank that hangs or is stopped never makes the others wait
  // forever. A dead rank is noticed sooner, by the launcher.
  virtual void set_timeout(double seconds) { timeout_s_ = seconds; }
  double timeout() const { return timeout_s_; }

protected:
  double timeout_s_ = 600;  // PyTorch's default for its NCCL and Gloo process groups: 10 minutes
};

class SingleProcess final : public Communicator {
public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  bool thread_safe() const override { return true; }
  std::string describe() const override { return "single process"; }
  void all_reduce_sum(float*, size_t) override {}
  void all_reduce_sum(double*, size_t) override {}
  void broadcast(void*, size_t, int) override {}
  std::vector<uint64_t> all_gather(uint64_t value) override { return {value}; }
  void barrier() override {}
  std::vector<std::string> gather(const std::string& bytes, int) override { return {bytes}; }
  [[noreturn]] void abort(const std::string& message, int exit_code) override;
};

// "rank 2 on h2", "ranks 2, 3 on h2 and rank 5 on h3": `ranks` (in rank order) grouped by the host
// `hosts[rank]` each runs on.
std::string ranks_on_hosts(const std::vector<int>& ranks, const std::vector<std::string>& hosts);

// Whether this process was started by an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx),
// read from the launchers' environment variables; MPI is not initialised to find out.
bool launched_by_mpi();
// Whether this build has MPI support.
bool mpi_built_in();

// The process's communicator, made on first use: MPI when this build has it and a launcher
// started the process, else SingleProcess. A duet binary started without mpirun never touches
// MPI. Throws duet::Error when a launcher started it but the build lacks MPI and the launcher
// asked for several ranks (each would silently train alone).
Communicator& world();

}  // namespace duet::dist
