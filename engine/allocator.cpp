#include "engine/allocator.h"
#include <cstdlib>
#include <new>
#include "engine/error.h"

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

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  s_.peak = s_.current;
  s_.peak_by_tag = s_.by_tag;
}

void Allocator::count_alloc(size_t bytes, MemTag tag) {
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
void* aligned_block(size_t bytes) {
  // aligned_alloc needs a size that is a multiple of the alignment; zero-byte tensors still get
  // a unique pointer so that storage identity works.
  const size_t a = CpuAllocator::kAlignment;
  const size_t rounded = ((bytes + a - 1) / a) * a;
  return std::aligned_alloc(a, rounded == 0 ? a : rounded);
}

size_t default_cache_limit() {
  if (const char* e = std::getenv("DUET_CPU_CACHE_MB"); e && *e) return static_cast<size_t>(std::strtoull(e, nullptr, 10)) << 20;
#if defined(__SANITIZE_ADDRESS__)
  return 0;  // AddressSanitizer must see every free to catch a use after it
#else
  return size_t(2048) << 20;
#endif
}
}  // namespace

CpuAllocator::CpuAllocator() : limit_(default_cache_limit()) {}

CpuAllocator::~CpuAllocator() {
  std::lock_guard<std::mutex> lk(cache_mu_);
  release_cached_locked();
}

size_t CpuAllocator::size_class(size_t bytes) {
  if (bytes < kCacheMin) return bytes;
  int top = 63;
  while (!(bytes >> top)) --top;
  const size_t step = size_t(1) << (top - 3);  // eight classes per power of two
  return (bytes + step - 1) / step * step;
}

void* CpuAllocator::allocate(size_t bytes, MemTag tag) {
  const size_t cls = size_class(bytes);
  void* p = nullptr;
  if (bytes >= kCacheMin) {
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (auto it = free_.find(cls); it != free_.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
      cached_ -= cls;
      hits_++;
      set_cached(static_cast<int64_t>(cached_));
    }
  }
  if (!p) p = aligned_block(cls);
  if (!p && release_cached() > 0) p = aligned_block(cls);
  if (!p) throw Error(fmt::format("out of host memory: could not allocate {} bytes for a {} buffer", bytes, mem_tag_name(tag)));
  count_alloc(bytes, tag);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes, MemTag tag) {
  count_free(bytes, tag);
  if (bytes >= kCacheMin) {
    const size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lk(cache_mu_);
    if (cached_ + cls <= limit_) {
      free_[cls].push_back(p);
      cached_ += cls;
      set_cached(static_cast<int64_t>(cached_));
      return;
    }
  }
  std::free(p);
}

size_t CpuAllocator::release_cached() {
  std::lock_guard<std::mutex> lk(cache_mu_);
  return release_cached_locked();
}

size_t CpuAllocator::release_cached_locked() {
  const size_t released = cached_;
  for (auto& [cls, blocks] : free_)
    for (void* p : blocks) std::free(p);
  free_.clear();
  cached_ = 0;
  set_cached(0);
  return released;
}

size_t CpuAllocator::cache_limit() const {
  std::lock_guard<std::mutex> lk(cache_mu_);
  return limit_;
}

void CpuAllocator::set_cache_limit(size_t bytes) {
  std::lock_guard<std::mutex> lk(cache_mu_);
  limit_ = bytes;
  if (cached_ > limit_) release_cached_locked();
}

int64_t CpuAllocator::cache_hits() const {
  std::lock_guard<std::mutex> lk(cache_mu_);
  return hits_;
}

CpuAllocator& cpu_allocator() {
  // Never destroyed: a tensor in static storage may be freed after any function-local static
  // would be, and the cache's blocks go back to the system with the process anyway.
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
