// Free-list bookkeeping of the caching allocator; see caching_allocator.h for the policy. Blocks
// are never split: a block is one allocation from the source, which keeps the bookkeeping two
// maps and makes release_cached() exact.
#include "backends/cuda/caching_allocator.h"
#include <algorithm>
#include <cstdio>
#include "engine/error.h"

namespace duet::cuda {

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[u]);
}

size_t CachingAllocator::round_size(size_t bytes) {
  if (bytes == 0) return kSmallGranularity;  // a unique pointer even for empty tensors
  if (bytes <= kSmallLimit) return (bytes + kSmallGranularity - 1) / kSmallGranularity * kSmallGranularity;
  return (bytes + kLargeGranularity - 1) / kLargeGranularity * kLargeGranularity;
}

bool CachingAllocator::fits(size_t block, size_t rounded) {
  if (block < rounded) return false;
  if (rounded <= kSmallLimit) return block == rounded;
  return block - rounded <= std::max(kLargeGranularity, rounded / 4);
}

CachingAllocator::CachingAllocator(std::string label, std::unique_ptr<RawMemorySource> source)
    : label_(std::move(label)), source_(std::move(source)) {}

CachingAllocator::~CachingAllocator() {
  // Live blocks belong to tensors that outlive the allocator (only possible in tests); leave them.
  std::lock_guard<std::mutex> lk(mu_);
  release_cached_locked();
}

void* CachingAllocator::allocate(size_t bytes, MemTag tag) { return allocate_impl(bytes, tag, true); }
void* CachingAllocator::try_allocate(size_t bytes, MemTag tag, bool may_release_cache) {
  return allocate_impl(bytes, tag, false, may_release_cache);
}

void* CachingAllocator::allocate_impl(size_t bytes, MemTag tag, bool throw_on_oom, bool may_release_cache) {
  const size_t rounded = round_size(bytes);
  void* p = nullptr;
  size_t block = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto& pool = rounded <= kSmallLimit ? free_small_ : free_large_;
    auto it = pool.lower_bound(rounded);  // the smallest cached block that is large enough
    if (it != pool.end() && fits(it->first, rounded)) {
      block = it->first;
      p = it->second;
      pool.erase(it);
      cs_.cache_hits++;
      cs_.cached -= static_cast<int64_t>(block);
      cs_.cached_blocks--;
    } else {
      p = source_->raw_alloc(rounded);
      if (!p && may_release_cache && cs_.cached > 0) {
        // Cached blocks of other sizes may be what stands between this request and success.
        cs_.oom_retries++;
        release_cached_locked();
        p = source_->raw_alloc(rounded);
      }
      if (!p) {
        if (!throw_on_oom) return nullptr;
        throw Error(oom_message_locked(bytes, rounded, tag));
      }
      block = rounded;
      cs_.source_allocs++;
      cs_.reserved += static_cast<int64_t>(block);
    }
    live_.emplace(p, block);
    cs_.in_use += static_cast<int64_t>(block);
    cs_.live_blocks++;
    update_cached_locked();
  }
  count_alloc(bytes, tag);
  return p;
}

void CachingAllocator::deallocate(void* p, size_t bytes, MemTag tag) {
  // Called from Storage's destructor: it must not throw, so a foreign pointer is reported and
  // dropped rather than raised.
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = live_.find(p);
    if (it == live_.end()) {
      std::fprintf(stderr, "duet: %s allocator asked to free %p, which it did not allocate; ignored\n", label_.c_str(), p);
      return;
    }
    const size_t block = it->second;
    live_.erase(it);
    (block <= kSmallLimit ? free_small_ : free_large_).emplace(block, p);
    cs_.in_use -= static_cast<int64_t>(block);
    cs_.live_blocks--;
    cs_.cached += static_cast<int64_t>(block);
    cs_.cached_blocks++;
    update_cached_locked();
  }
  count_free(bytes, tag);
}

size_t CachingAllocator::release_cached() {
  std::lock_guard<std::mutex> lk(mu_);
  return release_cached_locked();
}

size_t CachingAllocator::release_cached_locked() {
  size_t released = 0;
  if (!free_small_.empty() || !free_large_.empty()) source_->before_release();
  for (auto* pool : {&free_small_, &free_large_}) {
    for (const auto& [size, p] : *pool) {
      source_->raw_free(p, size);
      released += size;
      cs_.source_frees++;
    }
    pool->clear();
  }
  cs_.reserved -= static_cast<int64_t>(released);
  cs_.cached = 0;
  cs_.cached_blocks = 0;
  update_cached_locked();
  return released;
}

void CachingAllocator::update_cached_locked() { set_cached(cs_.cached); }

CachingStats CachingAllocator::caching_stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return cs_;
}

std::vector<size_t> CachingAllocator::largest_live_blocks(size_t k) const {
  std::vector<size_t> sizes;
  {
    std::lock_guard<std::mutex> lk(mu_);
    sizes.reserve(live_.size());
    for (const auto& kv : live_) sizes.push_back(kv.second);
  }
  const size_t n = std::min(k, sizes.size());
  std::partial_sort(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(n), sizes.end(), std::greater<>());
  sizes.resize(n);
  return sizes;
}

std::string CachingAllocator::oom_message_locked(size_t bytes, size_t rounded, MemTag tag) {
  std::string device;
  if (auto info = source_->info())
    device = fmt::format("{} free of {} on the device", format_bytes(double(info->free)), format_bytes(double(info->total)));
  else
    device = "free memory of the device unknown";
  std::vector<size_t> sizes;
  sizes.reserve(live_.size());
  for (const auto& kv : live_) sizes.push_back(kv.second);
  const size_t n = std::min<size_t>(5, sizes.size());
  std::partial_sort(sizes.begin(), sizes.begin() + static_cast<std::ptrdiff_t>(n), sizes.end(), std::greater<>());
  std::string largest;
  for (size_t i = 0; i < n; ++i) largest += (i ? ", " : "") + format_bytes(double(sizes[i]));
  return fmt::format(
      "{}: out of memory allocating {} (rounded to {}) for a buffer tagged {}: {}; duet holds {} ({} in {} live blocks, "
      "{} cached after releasing the cache and retrying); largest live blocks: {}. Reduce the batch size or the "
      "model, or free tensors you no longer need",
      label_, format_bytes(double(bytes)), format_bytes(double(rounded)), mem_tag_name(tag), device,
      format_bytes(double(cs_.reserved)), format_bytes(double(cs_.in_use)), cs_.live_blocks,
      format_bytes(double(cs_.cached)), largest.empty() ? "none" : largest);
}

}  // namespace duet::cuda
