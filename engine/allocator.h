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

// Host memory, 64-byte aligned (one AVX-512 register, one cache line).
//
// Buffers of kCacheMin bytes and more are rounded up to a size class (eight per power of two, so
// at most 12.5% slack) and, when freed, kept in a free list of that class for the next request
// of the class instead of going back to the C library: a training step that repeats the last
// one's shapes then reuses the pages the last one touched, where glibc returns big blocks to the
// kernel (munmap, heap trim) and every fresh buffer is first-touched again (a page fault and a
// zeroed page per 4 KiB). Smaller buffers go straight to the C library, which recycles them
// itself. `cached` in the stats counts the bytes held in the free lists; `current`/`peak` count
// the bytes of live tensors as they were asked for. The cache holds at most cache_limit() bytes
// (DUET_CPU_CACHE_MB, default 2048, 0 under AddressSanitizer; 0 turns caching off), is given
// back when an allocation fails, and release_cached() gives it back on demand.
class CpuAllocator final : public Allocator {
public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kCacheMin = size_t(64) << 10;

  CpuAllocator();
  ~CpuAllocator() override;
  void* allocate(size_t bytes, MemTag tag) override;
  void deallocate(void* p, size_t bytes, MemTag tag) override;
  const char* name() const override { return "cpu"; }

  // The size class a request of `bytes` is served from (bytes themselves below kCacheMin).
  static size_t size_class(size_t bytes);
  // Frees every cached block; returns the bytes given back.
  size_t release_cached();
  size_t cache_limit() const;
  void set_cache_limit(size_t bytes);  // 0: no caching (the cache is released)
  int64_t cache_hits() const;          // requests served from the cache since start

private:
  size_t release_cached_locked();
  mutable std::mutex cache_mu_;
  std::unordered_map<size_t, std::vector<void*>> free_;  // size class -> cached blocks
  size_t cached_ = 0, limit_ = 0;
  int64_t hits_ = 0;
};

CpuAllocator& cpu_allocator();

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
