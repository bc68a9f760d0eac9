// The CUDA caching allocator's bookkeeping, run on host memory (malloc with a capacity limit standing
// in for cudaMalloc), so reuse, size classes, cache release, the out-of-memory retry and the
// counters are checked in every CI run, GPU or not.
#include <gtest/gtest.h>

#ifdef DUET_HAVE_CUDA
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include "backends/cuda/caching_allocator.h"
#include "engine/error.h"

using duet::MemTag;
using duet::cuda::CachingAllocator;
using duet::cuda::RawMemorySource;

namespace {

// malloc with a byte budget, counting calls; a stand-in for one GPU.
class HostSource final : public RawMemorySource {
public:
  explicit HostSource(size_t capacity) : capacity_(capacity) {}
  void* raw_alloc(size_t bytes) override {
    if (used_ + bytes > capacity_) return nullptr;
    void* p = std::malloc(bytes);
    if (p) {
      used_ += bytes;
      ++allocs_;
    }
    return p;
  }
  void raw_free(void* p, size_t bytes) override {
    std::free(p);
    used_ -= bytes;
    ++frees_;
  }
  std::optional<Info> info() override { return Info{capacity_ - used_, capacity_}; }
  void before_release() override { ++syncs_; }
  int syncs() const { return syncs_; }

  size_t used() const { return used_; }
  int allocs() const { return allocs_; }
  int frees() const { return frees_; }

private:
  size_t capacity_, used_ = 0;
  int allocs_ = 0, frees_ = 0, syncs_ = 0;
};

constexpr size_t MiB = size_t(1) << 20;

struct Fixture {
  HostSource* src;
  std::unique_ptr<CachingAllocator> alloc;
  explicit Fixture(size_t capacity = 64 * MiB) {
    auto s = std::make_unique<HostSource>(capacity);
    src = s.get();
    alloc = std::make_unique<CachingAllocator>("test:0", std::move(s));
  }
};

}  // namespace

TEST(CudaCachingAllocator, SizeClasses) {
  EXPECT_EQ(CachingAllocator::round_size(0), 512u);  // empty tensors still get a unique block
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(MiB), MiB);            // the largest small request
  EXPECT_EQ(CachingAllocator::round_size(MiB + 1), 2 * MiB);    // large: 2 MiB granules
  EXPECT_EQ(CachingAllocator::round_size(5 * MiB + 3), 6 * MiB);
  // Small blocks serve only their own class; large ones tolerate bounded waste.
  EXPECT_TRUE(CachingAllocator::fits(1024, 1024));
  EXPECT_FALSE(CachingAllocator::fits(2048, 1024));
  EXPECT_FALSE(CachingAllocator::fits(1024, 2048));
  EXPECT_TRUE(CachingAllocator::fits(4 * MiB, 2 * MiB));     // waste 2 MiB = one granule
  EXPECT_FALSE(CachingAllocator::fits(6 * MiB, 2 * MiB));    // waste 4 MiB > max(2 MiB, 0.5 MiB)
  EXPECT_TRUE(CachingAllocator::fits(100 * MiB, 80 * MiB));  // waste 20 MiB = a quarter of 80
  EXPECT_FALSE(CachingAllocator::fits(102 * MiB, 80 * MiB));
}

TEST(CudaCachingAllocator, ReusesFreedBlocks) {
  Fixture f;
  void* a = f.alloc->allocate(1000, MemTag::activation);
  f.alloc->deallocate(a, 1000, MemTag::activation);
  void* b = f.alloc->allocate(900, MemTag::activation);  // same 1024-byte class
  EXPECT_EQ(a, b);
  EXPECT_EQ(f.src->allocs(), 1);
  auto cs = f.alloc->caching_stats();
  EXPECT_EQ(cs.cache_hits, 1);
  EXPECT_EQ(cs.source_allocs, 1);
  // A different class cannot take it.
  void* c = f.alloc->allocate(3000, MemTag::activation);
  EXPECT_NE(c, b);
  EXPECT_EQ(f.src->allocs(), 2);
  f.alloc->deallocate(b, 900, MemTag::activation);
  f.alloc->deallocate(c, 3000, MemTag::activation);
}

TEST(CudaCachingAllocator, SteadyStateStepAllocatesNothingNew) {
  Fixture f;
  auto step = [&] {
    std::vector<std::pair<void*, size_t>> live;
    for (size_t bytes : {size_t(4096), size_t(3 * MiB), size_t(100), size_t(5 * MiB), size_t(4096)})
      live.emplace_back(f.alloc->allocate(bytes, MemTag::activation), bytes);
    for (auto& [p, bytes] : live) f.alloc->deallocate(p, bytes, MemTag::activation);
  };
  step();
  const int after_first = f.src->allocs();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(f.src->allocs(), after_first);
  EXPECT_EQ(f.alloc->stats().current, 0);
}

TEST(CudaCachingAllocator, CountersAndCachedBytes) {
  Fixture f;
  const auto s0 = f.alloc->stats();
  void* a = f.alloc->allocate(1000, MemTag::parameter);
  void* b = f.alloc->allocate(3 * MiB, MemTag::workspace);
  auto s = f.alloc->stats();
  EXPECT_EQ(s.current - s0.current, int64_t(1000 + 3 * MiB));  // requested bytes, as the profiler reports
  EXPECT_EQ(s.allocations - s0.allocations, 2);
  EXPECT_EQ(s.by_tag[static_cast<int>(MemTag::parameter)], 1000);
  EXPECT_EQ(s.by_tag[static_cast<int>(MemTag::workspace)], int64_t(3 * MiB));
  EXPECT_EQ(s.cached, 0);
  auto cs = f.alloc->caching_stats();
  EXPECT_EQ(cs.reserved, int64_t(1024 + 4 * MiB));  // rounded blocks
  EXPECT_EQ(cs.in_use, cs.reserved);
  f.alloc->deallocate(b, 3 * MiB, MemTag::workspace);
  s = f.alloc->stats();
  EXPECT_EQ(s.cached, int64_t(4 * MiB));  // reserved but unused
  EXPECT_EQ(s.peak - s0.current, int64_t(1000 + 3 * MiB));
  EXPECT_EQ(s.frees - s0.frees, 1);
  cs = f.alloc->caching_stats();
  EXPECT_EQ(cs.cached_blocks, 1);
  EXPECT_EQ(cs.live_blocks, 1);
  EXPECT_EQ(f.alloc->largest_live_blocks(3), std::vector<size_t>{1024});
  f.alloc->deallocate(a, 1000, MemTag::parameter);
}

TEST(CudaCachingAllocator, ReleaseCachedGivesMemoryBack) {
  Fixture f;
  void* a = f.alloc->allocate(3 * MiB, MemTag::activation);
  void* b = f.alloc->allocate(2000, MemTag::activation);
  f.alloc->deallocate(a, 3 * MiB, MemTag::activation);
  f.alloc->deallocate(b, 2000, MemTag::activation);
  EXPECT_EQ(f.src->used(), 4 * MiB + 2048);
  EXPECT_EQ(f.alloc->release_cached(), 4 * MiB + 2048);
  EXPECT_EQ(f.src->used(), 0u);
  EXPECT_EQ(f.src->frees(), 2);
  EXPECT_EQ(f.src->syncs(), 1);  // the device is drained once before blocks go back
  EXPECT_EQ(f.alloc->release_cached(), 0u);
  EXPECT_EQ(f.src->syncs(), 1);  // nothing to release: no synchronisation
  EXPECT_EQ(f.alloc->stats().cached, 0);
  EXPECT_EQ(f.alloc->caching_stats().reserved, 0);
}

TEST(CudaCachingAllocator, OutOfMemoryReleasesCacheAndRetries) {
  Fixture f(7 * MiB);
  void* a = f.alloc->allocate(6 * MiB, MemTag::activation);
  f.alloc->deallocate(a, 6 * MiB, MemTag::activation);  // cached: 6 of 7 MiB still held from the source
  // A 2 MiB block cannot come from the source now, and the cached 6 MiB block would waste too much
  // to serve it, so the allocator must release its cache and ask again.
  void* b = f.alloc->allocate(1 * MiB + 1, MemTag::activation);
  EXPECT_NE(b, nullptr);
  auto cs = f.alloc->caching_stats();
  EXPECT_EQ(cs.oom_retries, 1);
  EXPECT_EQ(cs.cached, 0);
  EXPECT_EQ(f.src->used(), 2 * MiB);
  f.alloc->deallocate(b, 1 * MiB + 1, MemTag::activation);
}

// cuDNN's candidates are probed for workspace one after another: only the first probe that does not
// fit may empty the cache (one device synchronisation per algorithm search).
TEST(CudaCachingAllocator, TryAllocateCanKeepTheCache) {
  Fixture f(7 * MiB);
  void* a = f.alloc->allocate(6 * MiB, MemTag::activation);
  f.alloc->deallocate(a, 6 * MiB, MemTag::activation);
  const int syncs = f.src->syncs();
  EXPECT_EQ(f.alloc->try_allocate(1 * MiB + 1, MemTag::workspace, false), nullptr);
  EXPECT_EQ(f.src->syncs(), syncs) << "no release, no synchronisation";
  EXPECT_EQ(f.alloc->caching_stats().oom_retries, 0);
  EXPECT_EQ(f.alloc->stats().cached, int64_t(6 * MiB));
  void* b = f.alloc->try_allocate(1 * MiB + 1, MemTag::workspace, true);
  EXPECT_NE(b, nullptr);
  EXPECT_EQ(f.src->syncs(), syncs + 1);
  EXPECT_EQ(f.alloc->caching_stats().oom_retries, 1);
  f.alloc->deallocate(b, 1 * MiB + 1, MemTag::workspace);
}

TEST(CudaCachingAllocator, OutOfMemoryErrorIsDescriptive) {
  Fixture f(8 * MiB);
  void* a = f.alloc->allocate(5 * MiB, MemTag::parameter);
  try {
    f.alloc->allocate(5 * MiB, MemTag::activation);
    FAIL() << "expected an out-of-memory duet::Error";
  } catch (const duet::Error& e) {
    const std::string msg = e.what();
    for (const char* frag : {"test:0", "out of memory", "5.00 MiB", "6.00 MiB", "activation", "free of 8.00 MiB",
                             "largest live blocks: 6.00 MiB", "batch size"})
      EXPECT_NE(msg.find(frag), std::string::npos) << frag << " not in: " << msg;
  }
  EXPECT_EQ(f.alloc->try_allocate(5 * MiB, MemTag::activation), nullptr);
  EXPECT_EQ(f.alloc->stats().current, int64_t(5 * MiB));  // failed requests count nothing
  f.alloc->deallocate(a, 5 * MiB, MemTag::parameter);
}

TEST(CudaCachingAllocator, ForeignPointerIsIgnoredNotFatal) {
  Fixture f;
  int dummy = 0;
  f.alloc->deallocate(&dummy, 4, MemTag::activation);  // reported on stderr, no throw, no crash
  EXPECT_EQ(f.alloc->stats().frees, 0);
}

TEST(CudaCachingAllocator, DistinctLiveBlocks) {
  Fixture f;
  std::set<void*> seen;
  std::vector<void*> ps;
  for (int i = 0; i < 50; ++i) {
    void* p = f.alloc->allocate(static_cast<size_t>(i * 37), MemTag::activation);
    EXPECT_TRUE(seen.insert(p).second);
    ps.push_back(p);
  }
  for (int i = 0; i < 50; ++i) f.alloc->deallocate(ps[i], static_cast<size_t>(i * 37), MemTag::activation);
  EXPECT_EQ(f.alloc->stats().current, 0);
}

TEST(CudaCachingAllocator, FormatBytes) {
  EXPECT_EQ(duet::cuda::format_bytes(512), "512 B");
  EXPECT_EQ(duet::cuda::format_bytes(1536), "1.50 KiB");
  EXPECT_EQ(duet::cuda::format_bytes(3.0 * 1024 * 1024 * 1024), "3.00 GiB");
}

#else
TEST(CudaCachingAllocator, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend (configure with -DDUET_CUDA=ON)"; }
#endif
