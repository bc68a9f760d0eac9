// Allocators: the one place that counts bytes. Every device has one; each keeps the counters the
// profiler reports (current, peak, allocations, frees, cached, bytes by tag).
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace duet {

// What a buffer is for, so memory can be broken down the way people reason about training.
enum class MemTag : uint8_t { activation, parameter, gradient, optimizer_state, workspace, data, count };
constexpr int kNumMemTags = static_cast<int>(MemTag::count);
const char* mem_tag_name(MemTag t);

struct MemoryStats {
  int64_t current = 0;      // bytes in live tensors
  int64_t peak = 0;         // high-water mark of `current` since the last reset_peak()
  int64_t allocations = 0;  // number of allocate() calls
  int64_t frees = 0;
  int64_t cached = 0;       // bytes held by a caching allocator but not in use
  int64_t allocated_total = 0;  // bytes ever allocated (profiler: bytes allocated inside an op)
  std::array<int64_t, kNumMemTags> by_tag{};       // current bytes per tag
  std::array<int64_t, kNumMemTags> peak_by_tag{};  // per-tag high-water marks
};

class Allocator {
public:
  virtual ~Allocator() = default;
  virtual void* allocate(size_t bytes, MemTag tag) = 0;
  virtual void deallocate(void* p, size_t bytes, MemTag tag) = 0;
  virtual const char* name() const = 0;
  MemoryStats stats() const;
  // current and peak only: what the profiler reads around every op (stats() copies every counter)
  struct Usage {
    int64_t current = 0, peak = 0;
  };
  Usage usage() const;
  void reset_peak();

protected:
  // Subclasses call these around their real allocation so counting lives in one place.
  void count_alloc(size_t bytes, MemTag tag);
  void count_free(size_t bytes, MemTag tag);
  void set_cached(int64_t bytes);
  // Moves live bytes from one tag to another (autograd keeps a gradient buffer it was handed).
public:
  void retag(size_t bytes, MemTag from, MemTag to);
protected:

private:
  mutable std::mutex mu_;  // allocation is not on the per-element hot path; a mutex keeps peak exact
  MemoryStats s_;
};

// Host memory, 64-byte aligned (one AVX-512 register, one cache line), with a cache of large
// blocks. A training step allocates the same large activations every step; handed back to glibc,
// blocks above its mmap threshold (up to 32 MiB) go back to the kernel on free, and the next step
// pays a page fault for every 4 KiB it touches first: measured here, ReLU and add forward ran at
// 2 GB/s instead of 20. Small blocks suffer the same way at batch 1: a freed 16-64 KiB
// activation at the top of glibc's heap lets it trim the heap (brk, a TLB shootdown on every
// core that runs the process) and the next op faults the pages in again. So blocks of at least
// kCacheMin bytes (4 KiB: below, glibc's own bins serve well) are rounded up to a size class
// (quarter steps between powers of two: at most 25% slack) and kept on free, to be reused by the
// next request of that class. `cached` counts the bytes kept. When a freed block would take the
// cache past its limit, the blocks of stale classes (nobody asked for one in the last
// kStaleAfter requests: the workload has moved on) are released; if that does not make room,
// the freed block goes back to the system and the cache keeps what it has. (Releasing the whole
// cache instead made every block of the next step fault again: DenseNet-121 at 224 px, whose
// step keeps about as many free blocks as the limit, ran 1.6x slower.) The limit is half of
// usable_memory_bytes(): the free blocks of a step with many distinct sizes reach 1.6x its live
// peak (DenseNet-121 at 224 px, batch 64: 12 GiB free beside 7.6 GiB live), and a quarter made
// that step page-fault on about 5 GB every step, 1.7x slower (docs/cpu_backend.md). Sanitizer
// builds and DUET_CPU_CACHE=0 turn the cache off (a reused block would hide use-after-free).
class CpuAllocator final : public Allocator {
public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kCacheMin = size_t{4} << 10;
  // Requests of cacheable size after which a class nobody asked for is stale: tens of training
  // steps of the zoo's models (DenseNet-121 at 224 px makes about 800 such requests per step).
  static constexpr uint64_t kStaleAfter = 1 << 16;
  CpuAllocator();
  void* allocate(size_t bytes, MemTag tag) override;
  void deallocate(void* p, size_t bytes, MemTag tag) override;
  const char* name() const override { return "cpu"; }

  bool caching() const { return caching_.load(); }
  void set_caching(bool on);     // off: releases the cache and stops keeping blocks
  void release_cached();         // frees every cached block
  int64_t cache_limit() const { return cache_limit_; }
  void set_cache_limit(int64_t bytes);
  static size_t size_class(size_t bytes);  // what a block of `bytes` is rounded up to when cached

private:
  struct SizeClass {
    std::vector<void*> blocks;  // unused blocks of this class
    uint64_t last_request = 0;  // request_count_ when a block of this class was last asked for
  };
  void release_cached_locked();
  void release_stale_locked();
  std::mutex cache_mu_;
  std::atomic<bool> caching_{true};
  int64_t cache_limit_ = 0;  // bytes of unused blocks kept at most
  int64_t cached_bytes_ = 0;
  uint64_t request_count_ = 0;  // requests of cacheable size so far
  // No class can be stale before this request count (the oldest last_request seen by the last
  // scan, plus kStaleAfter): a full cache in steady state skips the scan on every free.
  uint64_t next_stale_scan_ = kStaleAfter;
  std::unordered_map<size_t, SizeClass> free_;  // size class -> its unused blocks
};

CpuAllocator& cpu_allocator();

// Bytes the calling thread has had allocated, on any device, since it started. The profiler
// takes the difference across an op, so another thread's allocations (a data loader worker's)
// never count against an op.
int64_t thread_allocated_bytes();

// The tag new tensors get on this thread (activation unless a guard says otherwise).
MemTag current_mem_tag();
class MemTagGuard {
public:
  explicit MemTagGuard(MemTag t);
  ~MemTagGuard();
  MemTagGuard(const MemTagGuard&) = delete;
  MemTagGuard& operator=(const MemTagGuard&) = delete;
private:
  MemTag prev_;
};

}  // namespace duet
