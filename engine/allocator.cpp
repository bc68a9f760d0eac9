#include "engine/allocator.h"
#include <algorithm>
#include <cstdlib>
#include <string>
#include <new>
#include "engine/error.h"
#include "engine/machine_limits.h"

namespace duet {

const char* mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::activation: return "activation";
    case MemTag::parameter: return "parameter";
    case MemTag::gradient: return "gradient";
    case MemTag::optimizer_state: return "optimizer_state";
    case MemTag::workspace: return "workspace";
    case MemTag::data: return "data";
    case MemTag::count: break;
  }
  return "?";
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return s_;
}

Allocator::Usage Allocator::usage() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {s_.current, s_.peak};
}

namespace {
thread_local int64_t t_allocated = 0;
}
int64_t thread_allocated_bytes() { return t_allocated; }

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  s_.peak = s_.current;
  s_.peak_by_tag = s_.by_tag;
}

void Allocator::count_alloc(size_t bytes, MemTag tag) {
  t_allocated += static_cast<int64_t>(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  const int i = static_cast<int>(tag);
  s_.current += static_cast<int64_t>(bytes);
  s_.allocations++;
  s_.allocated_total += static_cast<int64_t>(bytes);
  s_.by_tag[i] += static_cast<int64_t>(bytes);
  if (s_.current > s_.peak) s_.peak = s_.current;
  if (s_.by_tag[i] > s_.peak_by_tag[i]) s_.peak_by_tag[i] = s_.by_tag[i];
}

void Allocator::count_free(size_t bytes, MemTag tag) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.current -= static_cast<int64_t>(bytes);
  s_.frees++;
  s_.by_tag[static_cast<int>(tag)] -= static_cast<int64_t>(bytes);
}

void Allocator::set_cached(int64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.cached = bytes;
}

void Allocator::retag(size_t bytes, MemTag from, MemTag to) {
  std::lock_guard<std::mutex> lk(mu_);
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  s_.by_tag[f] -= static_cast<int64_t>(bytes);
  s_.by_tag[t] += static_cast<int64_t>(bytes);
  if (s_.by_tag[t] > s_.peak_by_tag[t]) s_.peak_by_tag[t] = s_.by_tag[t];
}

namespace {
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

bool sanitized_build() {
#if defined(__SANITIZE_ADDRESS__)
  return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  return true;
#else
  return false;
#endif
#else
  return false;
#endif
}

}  // namespace

CpuAllocator::CpuAllocator() {
  const char* env = std::getenv("DUET_CPU_CACHE");
  caching_.store(!sanitized_build() && !(env && std::string(env) == "0"));
  // Half of what the process may use (the class comment says why not a quarter); blocks of
  // classes nobody asks for any more are released when the cache is full.
  cache_limit_ = usable_memory_bytes() / 2;
}

size_t CpuAllocator::size_class(size_t bytes) {
  if (bytes < kCacheMin) return round_up(bytes == 0 ? kAlignment : bytes, kAlignment);
  // Quarter steps between powers of two: 4K, 5K, 6K, 7K, 8K, 10K, ..., 64K, 80K, 96K, ...
  size_t pow2 = kCacheMin;
  while (pow2 * 2 <= bytes) pow2 *= 2;
  const size_t step = pow2 / 4;
  return round_up(bytes, step);
}

void* CpuAllocator::allocate(size_t bytes, MemTag tag) {
  const size_t cls = size_class(bytes);
  void* p = nullptr;
  if (caching_ && cls >= kCacheMin) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    SizeClass& c = free_[cls];
    c.last_request = ++request_count_;
    if (!c.blocks.empty()) {
      p = c.blocks.back();
      c.blocks.pop_back();
      cached_bytes_ -= static_cast<int64_t>(cls);
      set_cached(cached_bytes_);
    }
  }
  if (!p) {
    p = std::aligned_alloc(kAlignment, cls);
    if (!p && caching_) {
      release_cached();  // memory is short: give the cache back and try once more
      p = std::aligned_alloc(kAlignment, cls);
    }
    if (!p)
      throw Error(fmt::format("out of host memory: could not allocate {} bytes for a {} buffer", bytes, mem_tag_name(tag)));
  }
  count_alloc(bytes, tag);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes, MemTag tag) {
  count_free(bytes, tag);
  const size_t cls = size_class(bytes);
  if (caching_ && cls >= kCacheMin) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cached_bytes_ + static_cast<int64_t>(cls) > cache_limit_) release_stale_locked();
    if (cached_bytes_ + static_cast<int64_t>(cls) <= cache_limit_) {
      free_[cls].blocks.push_back(p);
      cached_bytes_ += static_cast<int64_t>(cls);
      set_cached(cached_bytes_);
      return;
    }
  }
  std::free(p);
}

void CpuAllocator::release_cached_locked() {
  for (auto& [cls, c] : free_)
    for (void* b : c.blocks) std::free(b);
  free_.clear();
  cached_bytes_ = 0;
  set_cached(0);
}

void CpuAllocator::release_stale_locked() {
  if (request_count_ <= next_stale_scan_) return;
  uint64_t oldest = request_count_;
  for (auto it = free_.begin(); it != free_.end();) {
    if (it->second.last_request + kStaleAfter >= request_count_) {
      oldest = std::min(oldest, it->second.last_request);
      ++it;
      continue;
    }
    for (void* b : it->second.blocks) std::free(b);
    cached_bytes_ -= static_cast<int64_t>(it->first * it->second.blocks.size());
    it = free_.erase(it);
  }
  next_stale_scan_ = oldest + kStaleAfter;
  set_cached(cached_bytes_);
}

void CpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lk(cache_mu_);
  release_cached_locked();
}

void CpuAllocator::set_caching(bool on) {
  std::lock_guard<std::mutex> lk(cache_mu_);
  if (!on) release_cached_locked();
  caching_.store(on);
}

void CpuAllocator::set_cache_limit(int64_t bytes) {
  std::lock_guard<std::mutex> lk(cache_mu_);
  cache_limit_ = bytes;
  if (cached_bytes_ > cache_limit_) release_cached_locked();
}

CpuAllocator& cpu_allocator() {
  // Never destroyed: tensors in static storage may be freed after it would have been.
  static CpuAllocator* a = new CpuAllocator;
  return *a;
}

namespace {
thread_local MemTag t_tag = MemTag::activation;
}
MemTag current_mem_tag() { return t_tag; }
MemTagGuard::MemTagGuard(MemTag t) : prev_(t_tag) { t_tag = t; }
MemTagGuard::~MemTagGuard() { t_tag = prev_; }

}  // namespace duet
