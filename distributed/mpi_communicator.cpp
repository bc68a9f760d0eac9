// The MPI communicator: MPI's C API (the C++ bindings are deprecated). MPI_Init_thread asks for
// MPI_THREAD_SERIALIZED, enough for one communication thread beside the training thread as long
// as calls never overlap, which a mutex guarantees; a library that grants less makes the
// gradient reducer communicate on the training thread instead (no overlap, same result).
// Errors: MPI's default handler (MPI_ERRORS_ARE_FATAL) ends the whole job, which is what a
// failed collective should do; duet's own errors end it through abort() (MPI_Abort).
// Hangs: every collective is started non-blocking and polled until it completes or the timeout
// passes (then abort()); between polls the thread yields, so a rank waiting for a slower one
// leaves its core to that rank's other threads.
// Who is missing: a collective cannot say which rank it waits for, so a rank that times out pings
// every other rank on a communicator of its own (point to point, MPI_Isend) and waits a moment for
// the answers; every rank answers pings while it waits in a collective. The ranks that do not
// answer (stopped, hung, or on a host cut off from this one) are named with their hosts.
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
    MPI_Comm_dup(MPI_COMM_WORLD, &health_);
    // Every rank's host name, for the run's layout and for naming a lost rank's host.
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int name_len = 0;
    MPI_Get_processor_name(name, &name_len);
    std::vector<char> names(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD);
    for (int r = 0; r < size_; ++r) hosts_.emplace_back(names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
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
    MPI_Comm_free(&health_);
    MPI_Comm_free(&local_);
    MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }
  bool thread_safe() const override { return thread_safe_; }
  const char* transport(Device) const override { return "mpi"; }
  std::vector<std::string> hosts() const override { return hosts_; }
  std::string describe() const override {
    return fmt::format("MPI ({}), {} ranks, {} on this machine", library_, size_, local_size_);
  }

  void all_reduce_sum(float* data, size_t count) override { all_reduce(data, count, MPI_FLOAT); }
  void all_reduce_sum(double* data, size_t count) override { all_reduce(data, count, MPI_DOUBLE); }

  void broadcast(void* data, size_t bytes, int root) override {
    DUET_CHECK(root >= 0 && root < size_, "broadcast: root rank {} is not in [0, {})", root, size_);
    auto* p = static_cast<char*>(data);
    in_pieces(bytes, "a broadcast", 1, [&](size_t first, int n, MPI_Request* req) {
      MPI_Ibcast(p + first, n, MPI_BYTE, root, MPI_COMM_WORLD, req);
    });
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    std::vector<uint64_t> all(static_cast<size_t>(size_));
    in_pieces(1, "an all-gather", 8, [&](size_t, int, MPI_Request* req) {
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
    in_pieces(1, "a gather", 4, [&](size_t, int, MPI_Request* req) {
      MPI_Igather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD, req);
    });
    int64_t total = 0;
    for (int r = 0; r < size_; ++r) {
      offsets[static_cast<size_t>(r)] = static_cast<int>(std::min<int64_t>(total, INT_MAX));
      total += sizes[static_cast<size_t>(r)];
    }
    DUET_CHECK(rank_ != root || total <= INT_MAX, "gather: {} bytes in all; at most {} can be gathered", total, INT_MAX);
    std::string all(rank_ == root ? static_cast<size_t>(total) : 0, '\0');
    in_pieces(1, "a gather", bytes.size(), [&](size_t, int, MPI_Request* req) {
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
    in_pieces(1, "a barrier", 0, [&](size_t, int, MPI_Request* req) { MPI_Ibarrier(MPI_COMM_WORLD, req); });
  }

  [[noreturn]] void abort(const std::string& message, int exit_code) override {
    // No lock: the communication thread may be blocked inside a collective the failed rank will
    // never join, and MPI_Abort is the way out of exactly that.
    std::cerr << message << std::endl;
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this line is for the compiler
  }

private:
  // Polls `req` until it completes, answering other ranks' pings meanwhile; past the timeout,
  // finds out which ranks do not answer and ends the job naming them and the collective.
  void wait(MPI_Request& req, const char* what, size_t bytes) {
    using clock = std::chrono::steady_clock;
    const auto start = clock::now();
    const auto deadline = start + std::chrono::duration<double>(timeout_s_);
    auto answered_at = start;
    for (int done = 0;;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) return;
      const auto now = clock::now();
      if (now - answered_at > std::chrono::milliseconds(1)) {
        answer_pings();
        answered_at = now;
      }
      if (now > deadline) {
        const double window = std::clamp(timeout_s_ / 4, 0.5, 5.0);
        const std::vector<int> silent = unanswered(window);
        const std::string who =
            silent.empty()
                ? "every rank answered a ping, so none is lost: one is far slower than this one, or the ranks issued "
                  "different collectives"
                : fmt::format("no answer within {:g} s from {} (this rank runs on {}): stopped, hung, or cut off from "
                              "this host",
                              window, ranks_on_hosts(silent, hosts_), hosts_[static_cast<size_t>(rank_)]);
        abort(fmt::format("duet: rank {} of {} waited {:g} s in {} ({}, collective {} of this run) for the other ranks "
                          "(--comm-timeout); {}; ending the job",
                          rank_, size_, timeout_s_, what, size_text(bytes), calls_, who),
              3);
      }
      std::this_thread::yield();
    }
  }

  // Answers the pings other ranks sent this one (a rank that timed out asks who is still there).
  void answer_pings() {
    for (int flag = 1; flag;) {
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kPing, health_, &flag, &st);
      if (!flag) return;
      char b = 0;
      MPI_Recv(&b, 1, MPI_BYTE, st.MPI_SOURCE, kPing, health_, MPI_STATUS_IGNORE);
      MPI_Request r;
      MPI_Isend(&kByte, 1, MPI_BYTE, st.MPI_SOURCE, kPong, health_, &r);
      MPI_Request_free(&r);
    }
  }

  // Pings every other rank and waits up to `seconds` for the answers: the ranks that gave none.
  // The pings are never waited for: a rank that cannot receive them is what this looks for.
  std::vector<int> unanswered(double seconds) {
    std::vector<char> answered(static_cast<size_t>(size_), 0);
    answered[static_cast<size_t>(rank_)] = 1;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      MPI_Request req;
      MPI_Isend(&kByte, 1, MPI_BYTE, r, kPing, health_, &req);
      MPI_Request_free(&req);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    int missing = size_ - 1;
    while (missing > 0 && std::chrono::steady_clock::now() < deadline) {
      answer_pings();
      int flag = 0;
      MPI_Status st;
      MPI_Iprobe(MPI_ANY_SOURCE, kPong, health_, &flag, &st);
      if (!flag) {
        std::this_thread::yield();
        continue;
      }
      char b = 0;
      MPI_Recv(&b, 1, MPI_BYTE, st.MPI_SOURCE, kPong, health_, MPI_STATUS_IGNORE);
      if (!answered[static_cast<size_t>(st.MPI_SOURCE)]) --missing;
      answered[static_cast<size_t>(st.MPI_SOURCE)] = 1;
    }
    std::vector<int> silent;
    for (int r = 0; r < size_; ++r)
      if (!answered[static_cast<size_t>(r)]) silent.push_back(r);
    return silent;
  }

  static std::string size_text(size_t bytes) {
    if (bytes < 10000) return fmt::format("{} B", bytes);
    if (bytes < 10000000) return fmt::format("{:.1f} kB", static_cast<double>(bytes) / 1e3);
    return fmt::format("{:.1f} MB", static_cast<double>(bytes) / 1e6);
  }

  // One collective over `count` elements of `elem_bytes` bytes, in pieces MPI's int counts can
  // hold: start(first, n, &request) starts a piece, which is waited for before the next.
  // Serialised with the other calls (MPI_THREAD_SERIALIZED).
  template <class Start>
  void in_pieces(size_t count, const char* what, size_t elem_bytes, Start start) {
    std::lock_guard lock(mu_);
    ++calls_;
    for (size_t done = 0; done < count;) {
      const size_t n = std::min<size_t>(count - done, INT_MAX);
      MPI_Request req;
      start(done, static_cast<int>(n), &req);
      wait(req, what, count * elem_bytes);
      done += n;
    }
  }

  template <class T>
  void all_reduce(T* data, size_t count, MPI_Datatype type) {
    in_pieces(count, "an all-reduce", sizeof(T), [&](size_t first, int n, MPI_Request* req) {
      MPI_Iallreduce(MPI_IN_PLACE, data + first, n, type, MPI_SUM, MPI_COMM_WORLD, req);
    });
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool thread_safe_ = false;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm health_ = MPI_COMM_NULL;  // pings of a rank that timed out, apart from the collectives
  static constexpr int kPing = 1, kPong = 2;
  static inline const char kByte = 1;
  std::vector<std::string> hosts_;
  uint64_t calls_ = 0;  // collectives so far, named when one times out
  std::string library_;
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<Mpi>(); }

}  // namespace duet::dist
