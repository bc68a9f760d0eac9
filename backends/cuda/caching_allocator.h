// The caching allocator behind every CUDA tensor. cudaMalloc and cudaFree are slow and cudaFree
// synchronises the whole device, so freed blocks are kept in free lists and handed out again on
// the next request of the same size class: a training step that repeats the shapes of the last
// one allocates nothing new from the driver. All work on a device runs on one stream, so a block
// freed on the host while kernels that use it are still queued can be reused at once: any new
// user is queued behind them.
//
// The bookkeeping knows nothing about CUDA: it takes its memory from a RawMemorySource, which is
// cudaMalloc in the backend and malloc in tests/test_cuda_allocator.cpp (no GPU needed there).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>
#include "engine/allocator.h"

namespace duet::cuda {

// Where big chunks of memory come from.
class RawMemorySource {
public:
  struct Info {
    size_t free = 0, total = 0;
  };
  virtual ~RawMemorySource() = default;
  // nullptr when the memory is exhausted (the allocator then releases its cache and retries);
  // other failures throw duet::Error.
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* p, size_t bytes) = 0;
  // Called once before a batch of raw_free calls: cached blocks may still be read by queued
  // kernels of tensors freed on the host, so the device must be idle before they go back.
  virtual void before_release() {}
  // Free and total memory of the device, for out-of-memory messages; nullopt when unknown.
  virtual std::optional<Info> info() = 0;
};

// Counters beyond MemoryStats: what is reserved from the source versus handed to tensors.
struct CachingStats {
  int64_t reserved = 0;       // bytes held from the source (live blocks + cached blocks)
  int64_t in_use = 0;         // bytes of blocks handed out (rounded sizes)
  int64_t cached = 0;         // bytes of free blocks kept for reuse
  int64_t live_blocks = 0, cached_blocks = 0;
  int64_t source_allocs = 0, source_frees = 0;  // cudaMalloc / cudaFree calls
  int64_t cache_hits = 0;                       // requests served from a free list
  int64_t oom_retries = 0;                      // times the cache was released to satisfy a request
};

class CachingAllocator final : public Allocator {
public:
  // Requests up to kSmallLimit are rounded to kSmallGranularity and reused only by requests of
  // exactly that size class; larger ones are rounded to kLargeGranularity (the driver's own page
  // size for big allocations) and may reuse a slightly larger cached block (see fits()).
  static constexpr size_t kSmallGranularity = 512;
  static constexpr size_t kSmallLimit = size_t(1) << 20;
  static constexpr size_t kLargeGranularity = size_t(2) << 20;

  static size_t round_size(size_t bytes);
  // Whether a cached block of `block` bytes may serve a request rounded to `rounded`: the waste is
  // bounded by a quarter of the request or one large granule, whichever is larger.
  static bool fits(size_t block, size_t rounded);

  // `label` names the device in messages ("cuda:0").
  CachingAllocator(std::string label, std::unique_ptr<RawMemorySource> source);
  ~CachingAllocator() override;

  void* allocate(size_t bytes, MemTag tag) override;  // throws duet::Error when out of memory
  // nullptr when out of memory. With may_release_cache the cache is released and the request retried
  // first, which waits for the device; a caller probing several sizes (cuDNN workspaces of several
  // algorithms) allows that once, not once per probe.
  void* try_allocate(size_t bytes, MemTag tag, bool may_release_cache = true);
  void deallocate(void* p, size_t bytes, MemTag tag) override;
  const char* name() const override { return label_.c_str(); }

  // Gives every cached block back to the source; returns the bytes released.
  size_t release_cached();
  CachingStats caching_stats() const;
  // Sizes of the k largest live blocks, largest first (for out-of-memory messages).
  std::vector<size_t> largest_live_blocks(size_t k) const;

private:
  void* allocate_impl(size_t bytes, MemTag tag, bool throw_on_oom, bool may_release_cache = true);
  size_t release_cached_locked();
  void update_cached_locked();
  std::string oom_message_locked(size_t bytes, size_t rounded, MemTag tag);

  std::string label_;
  std::unique_ptr<RawMemorySource> source_;
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> live_;         // pointer -> block size
  std::multimap<size_t, void*> free_small_, free_large_;  // block size -> pointer
  CachingStats cs_;
};

// "1.50 GiB", "512 B": sizes in messages and tables.
std::string format_bytes(double bytes);

}  // namespace duet::cuda
