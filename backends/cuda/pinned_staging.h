// Host-to-device copies go through pinned (page-locked) staging blocks: the host copies the
// caller's bytes into a block, the DMA out of it is queued on the device's stream, and an event
// recorded after the DMA says when the block may be filled again. So a copy neither waits for the
// stream nor keeps the caller's buffer (it may be freed the moment copy_ returns), and the DMA runs
// at pinned-memory speed; from pageable memory the driver stages the bytes itself, in pieces, and
// the copy had to wait for the whole stream before the caller's buffer could be let go.
//
// StagingBlocks is the bookkeeping. The CUDA calls it makes sit behind StagingRuntime, so that
// tests/test_cuda_host.cpp checks the policy with fake memory and fake events.
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace duet::cuda {

class StagingRuntime {
public:
  virtual ~StagingRuntime() = default;
  virtual void* allocate(size_t bytes) = 0;  // pinned host memory, nullptr when there is none
  virtual void release(void* p) = 0;
  virtual void* new_event() = 0;
  virtual void record(void* event) = 0;  // fires once everything queued on the stream so far has run
  virtual bool finished(void* event) = 0;  // without waiting
  virtual void wait(void* event) = 0;
};

class StagingBlocks {
public:
  // Holds at most `limit` bytes of pinned memory; a larger copy is not staged.
  StagingBlocks(StagingRuntime& runtime, size_t limit) : rt_(runtime), limit_(limit) {}
  StagingBlocks(const StagingBlocks&) = delete;
  StagingBlocks& operator=(const StagingBlocks&) = delete;

  // A block of at least `bytes` that no queued copy still reads. Policy: the smallest free block
  // that fits; else a new one (sizes rounded up to a power of two, at least kMinBlock) while the
  // limit allows; else the free blocks are given back to make room; else it waits for the block
  // queued longest ago. nullptr when `bytes` exceeds the limit or pinned memory runs out (the caller
  // then copies from pageable memory and waits).
  class Lease {
  public:
    Lease() = default;
    Lease(Lease&& o) noexcept : owner_(o.owner_), block_(o.block_) { o.owner_ = nullptr; }
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    Lease& operator=(Lease&&) = delete;
    ~Lease();  // a lease never queued (an error on the way) gives its block back as free
    void* get() const;
    explicit operator bool() const { return owner_ != nullptr; }
    // The copy out of the block is queued: the block stays busy until the event recorded now fires.
    void queued();

  private:
    friend class StagingBlocks;
    Lease(StagingBlocks* owner, size_t block) : owner_(owner), block_(block) {}
    StagingBlocks* owner_ = nullptr;
    size_t block_ = 0;
  };
  Lease acquire(size_t bytes);

  static constexpr size_t kMinBlock = size_t(1) << 20;
  size_t held_bytes() const;
  int64_t waits() const;  // how often acquire had to wait for a queued copy

private:
  enum class State { free, leased, in_flight };
  struct Block {
    void* p = nullptr;
    size_t bytes = 0;
    void* event = nullptr;
    State state = State::free;
    uint64_t queued_at = 0;  // order of queueing, to wait for the oldest first
  };
  // Index of a free block of at least `bytes`, the smallest; -1 when none.
  int64_t smallest_free(size_t bytes) const;
  void refresh();  // in-flight blocks whose event has fired become free
  void give_back_free();

  StagingRuntime& rt_;
  const size_t limit_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;  // a given-back block keeps its slot (p == nullptr), so leases stay valid
  size_t held_ = 0;
  uint64_t clock_ = 0;
  int64_t waits_ = 0;
};

}  // namespace duet::cuda
