// The MPI communicator: MPI's C API (the C++ bindings are deprecated). MPI_Init_thread asks for
// MPI_THREAD_SERIALIZED, enough for one communication thread beside the training thread as long
// as calls never overlap, which a mutex guarantees; a library that grants less makes the
// gradient reducer communicate on the training thread instead (no overlap, same result).
// Errors: MPI's default handler (MPI_ERRORS_ARE_FATAL) ends the whole job, which is what a
// failed collective should do; duet's own errors end it through abort() (MPI_Abort).
// Hangs: every collective is started non-blocking and polled until it completes or the timeout
// passes (then abort()); between polls the thread yields, so a rank waiting for a slower one
// leaves its core to that rank's other threads.
#include <mpi.h>
#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <iostream>
#include <mutex>
#include <fmt/format.h>
#include "distributed/communicator.h"
#include "engine/error.h"

namespace duet::dist {

namespace {

class Mpi final : public Communicator {
public:
  Mpi() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    DUET_CHECK(!initialized, "internal: MPI was initialised outside duet's communicator");
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
    thread_safe_ = provided >= MPI_THREAD_SERIALIZED;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_);
    MPI_Comm_rank(local_, &local_rank_);
    MPI_Comm_size(local_, &local_size_);
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    int len = 0;
    MPI_Get_library_version(version, &len);
    library_ = std::string(version, static_cast<size_t>(std::max(len, 0)));
    library_ = library_.substr(0, library_.find_first_of(",\n"));
  }
  ~Mpi() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    MPI_Comm_free(&local_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  bool thread_safe() const override { return thread_safe_; }
  const char* transport(Device) const override { return "mpi"; }
  std::string describe() const override {
    return fmt::format("MPI ({}), {} ranks, {} on this machine", library_, size_, local_size_);
  }

  void all_reduce_sum(float* data, size_t count) override { all_reduce(data, count, MPI_FLOAT); }
  void all_reduce_sum(double* data, size_t count) override { all_reduce(data, count, MPI_DOUBLE); }

  void broadcast(void* data, size_t bytes, int root) override {
    DUET_CHECK(root >= 0 && root < size_, "broadcast: root rank {} is not in [0, {})", root, size_);
    auto* p = static_cast<char*>(data);
    in_pieces(bytes, "a broadcast", [&](size_t first, int n, MPI_Request* req) {
      MPI_Ibcast(p + first, n, MPI_BYTE, root, MPI_COMM_WORLD, req);
    });
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    std::vector<uint64_t> all(static_cast<size_t>(size_));
    in_pieces(1, "an all-gather", [&](size_t, int, MPI_Request* req) {
      MPI_Iallgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD, req);
    });
    return all;
  }

  std::vector<std::string> gather(const std::string& bytes, int root) override {
    DUET_CHECK(root >= 0 && root < size_, "gather: root rank {} is not in [0, {})", root, size_);
    DUET_CHECK(bytes.size() <= INT_MAX, "gather: {} bytes from rank {}; at most {} can be gathered", bytes.size(), rank_,
               INT_MAX);
    // The sizes first, then the bytes (MPI_Gatherv's counts and displacements are ints).
    const int n = static_cast<int>(bytes.size());
    std::vector<int> sizes(static_cast<size_t>(size_)), offsets(static_cast<size_t>(size_));
    in_pieces(1, "a gather", [&](size_t, int, MPI_Request* req) {
      MPI_Igather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD, req);
    });
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[static_cast<size_t>(r)] = static_cast<int>(std::min<int64_t>(total, INT_MAX));
      total += sizes[static_cast<size_t>(r)];
    }
    DUET_CHECK(rank_ != root || total <= INT_MAX, "gather: {} bytes in all; at most {} can be gathered", total, INT_MAX);
    std::string all(rank_ == root ? static_cast<size_t>(total) : 0, '\0');
    in_pieces(1, "a gather", [&](size_t, int, MPI_Request* req) {
      MPI_Igatherv(bytes.data(), n, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, root, MPI_COMM_WORLD,
                   req);
    });
    if (rank_ != root) return {};
    std::vector<std::string> out;
    for (int r = 0; r < size_; ++r)
      out.push_back(all.substr(static_cast<size_t>(offsets[static_cast<size_t>(r)]), static_cast<size_t>(sizes[static_cast<size_t>(r)])));
    return out;
  }

  void barrier() override {
    in_pieces(1, "a barrier", [&](size_t, int, MPI_Request* req) { MPI_Ibarrier(MPI_COMM_WORLD, req); });
  }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    // No lock: the communication thread may be blocked inside a collective the failed rank will
    // never join, and MPI_Abort is the way out of exactly that.
    std::cerr << message << std::endl;
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this line is for the compiler
  }

private:
  // Polls `req` until it completes; past the timeout, ends the job naming this rank.
  void wait(MPI_Request& req, const char* what) {
    using clock = std::chrono::steady_clock;
    const auto deadline = clock::now() + std::chrono::duration<double>(timeout_s_);
    for (int done = 0;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      if (clock::now() > deadline)
        abort(fmt::format("duet: rank {} of {} waited {:g} s in {} for the other ranks (--comm-timeout): a rank is "
                          "hung, stopped or far slower than this one; ending the job",
                          rank_, size_, timeout_s_, what),
              3);
      std::this_thread::yield();
    }
  }

  // One collective over `count` elements, in pieces MPI's int counts can hold: start(first, n,
  // &request) starts a piece, which is waited for before the next. Serialised with the other
  // calls (MPI_THREAD_SERIALIZED).
  template <class Start>
  void in_pieces(size_t count, const char* what, Start start) {
    std::lock_guard lock(mu_);
    for (size_t done = 0; done < count;) {
      const size_t n = std::min<size_t>(count - done, INT_MAX);
      MPI_Request req;
      start(done, static_cast<int>(n), &req);
      wait(req, what);
      done += n;
    }
  }

  template <class T>
  void all_reduce(T* data, size_t count, MPI_Datatype type) {
    in_pieces(count, "an all-reduce", [&](size_t first, int n, MPI_Request* req) {
      MPI_Iallreduce(MPI_IN_PLACE, data + first, n, type, MPI_SUM, MPI_COMM_WORLD, req);
    });
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool thread_safe_ = false;
  MPI_Comm local_ = MPI_COMM_NULL;
  std::string library_;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<Mpi>(); }

}  // namespace duet::dist
