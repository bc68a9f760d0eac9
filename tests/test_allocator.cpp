// The allocator's counters: current and peak return to the expected values as tensors die, tags
// land in the right bucket.
#include "engine/machine_limits.h"
#include "tests/test_support.h"

using namespace duet;

TEST(Allocator, CountsCurrentPeakAndTags) {
  CpuAllocator& a = cpu_allocator();
  const MemoryStats before = a.stats();
  a.reset_peak();
  {
    Tensor x = Tensor::empty({1024});  // 4 KiB activation
    MemoryStats s = a.stats();
    EXPECT_EQ(s.current - before.current, 4096);
    EXPECT_EQ(s.allocations - before.allocations, 1);
    {
      MemTagGuard tag(MemTag::optimizer_state);
      Tensor y = Tensor::empty({256}, DType::f64);  // 2 KiB optimizer state
      s = a.stats();
      EXPECT_EQ(s.by_tag[static_cast<int>(MemTag::optimizer_state)] -
                    before.by_tag[static_cast<int>(MemTag::optimizer_state)],
                2048);
    }
    s = a.stats();
    EXPECT_EQ(s.current - before.current, 4096);
    EXPECT_EQ(s.peak - before.current, 6144);
  }
  const MemoryStats after = a.stats();
  EXPECT_EQ(after.current, before.current);
  EXPECT_EQ(after.frees - before.frees, 2);
  EXPECT_EQ(after.by_tag, before.by_tag);
}

TEST(Allocator, ViewsDoNotAllocate) {
  Tensor x = Tensor::zeros({8, 8});
  const MemoryStats s0 = cpu_allocator().stats();
  Tensor v = x.transpose(0, 1).slice(0, 1, 5).reshape({4, 8, 1});
  (void)v;
  EXPECT_EQ(cpu_allocator().stats().allocations, s0.allocations);
}

TEST(Allocator, GradientsAreTaggedAsGradients) {
  const int grad_tag = static_cast<int>(MemTag::gradient);
  const int64_t before = cpu_allocator().stats().by_tag[grad_tag];
  Tensor w = Tensor::ones({64}, TensorOptions().with_grad(true));
  sum(mul(w, w)).backward();
  EXPECT_EQ(cpu_allocator().stats().by_tag[grad_tag] - before, 256);
  w.zero_grad();
  EXPECT_EQ(cpu_allocator().stats().by_tag[grad_tag], before);
}

TEST(Allocator, PeakSeesTemporariesOfOneStep) {
  CpuAllocator& a = cpu_allocator();
  a.reset_peak();
  const int64_t base = a.stats().current;
  {
    Tensor x = Tensor::ones({1000});
    Tensor y = add(mul(x, 2.0), 1.0);  // one temporary of 4000 bytes dies inside
    (void)y;
  }
  EXPECT_EQ(a.stats().current, base);
  EXPECT_GE(a.stats().peak - base, 3 * 4000);
}

// The cache of host blocks (4 KiB and more): a freed block of a size class is handed out again for
// the next request of that class, counted as cached while it waits, and released on demand.
TEST(Allocator, CachesBlocksBySizeClass) {
  CpuAllocator& a = cpu_allocator();
  if (!a.caching()) GTEST_SKIP() << "the host block cache is off in this build (sanitizers or DUET_CPU_CACHE=0)";
  a.release_cached();
  EXPECT_EQ(a.stats().cached, 0);
  EXPECT_EQ(CpuAllocator::size_class(100), 128u);                   // small: 64-byte rounding only
  EXPECT_EQ(CpuAllocator::size_class(4 << 10), size_t{4} << 10);     // classes start at 4 KiB
  EXPECT_EQ(CpuAllocator::size_class((4 << 10) + 1), size_t{5} << 10);
  EXPECT_EQ(CpuAllocator::size_class(64 << 10), size_t{64} << 10);
  EXPECT_EQ(CpuAllocator::size_class((64 << 10) + 1), size_t{80} << 10);
  EXPECT_EQ(CpuAllocator::size_class(1000000), size_t{1048576});     // 960 KiB < 1e6 <= 1 MiB
  EXPECT_EQ(CpuAllocator::size_class(1048577), size_t{1310720});    // next quarter step: 1.25 MiB

  // A batch-1 activation (16,000 bytes: class 16 KiB) is kept and reused as a large one is.
  const void* small = nullptr;
  {
    Tensor s = Tensor::empty({4000});
    small = s.raw_data();
  }
  EXPECT_EQ(a.stats().cached, 16384);
  {
    Tensor t = Tensor::empty({4096});  // 16,384 bytes: the same class, the same block
    EXPECT_EQ(t.raw_data(), small);
    EXPECT_EQ(a.stats().cached, 0);
  }
  { Tensor tiny = Tensor::empty({100}); }  // 400 bytes: below the classes, back to glibc
  EXPECT_EQ(a.stats().cached, 16384);
  a.release_cached();

  const void* first = nullptr;
  {
    Tensor x = Tensor::empty({250000});  // 1,000,000 bytes: class 1 MiB
    first = x.raw_data();
  }
  EXPECT_EQ(a.stats().cached, 1048576);
  {
    Tensor y = Tensor::empty({255000});  // 1,020,000 bytes: the same class, the same block
    EXPECT_EQ(y.raw_data(), first);
    EXPECT_EQ(a.stats().cached, 0);
  }
  {
    Tensor z = Tensor::empty({300000});  // 1.2 MB: another class, a new block
    EXPECT_NE(z.raw_data(), first);
  }
  EXPECT_EQ(a.stats().cached, 1048576 + 1310720);
  a.release_cached();
  EXPECT_EQ(a.stats().cached, 0);

  // Lowering the limit below what is cached releases the cache.
  {
    Tensor x = Tensor::empty({250000}), y = Tensor::empty({250000});
  }
  EXPECT_EQ(a.stats().cached, 2 << 20);
  const int64_t before = a.cache_limit();
  a.set_cache_limit(1 << 20);
  EXPECT_LE(a.stats().cached, 1 << 20);
  a.set_cache_limit(before);

  // A limit below a block's class: nothing is kept.
  const int64_t limit = a.cache_limit();
  a.set_cache_limit(1 << 20);
  { Tensor w = Tensor::empty({1 << 20}); }  // 4 MiB > limit
  EXPECT_EQ(a.stats().cached, 0);
  a.set_cache_limit(limit);
}

// The cache may hold half of the memory the process may use: the machine's, or its control
// group's limit where that is smaller.
TEST(Allocator, CacheLimitIsHalfOfTheUsableMemory) {
  EXPECT_EQ(CpuAllocator().cache_limit(), usable_memory_bytes() / 2);
}

// A full cache keeps the blocks of classes still in use and returns the newcomer to the system
// (dropping everything made the next training step fault on every page again); a class nobody
// has asked for in kStaleAfter requests is released to make room.
TEST(Allocator, FullCacheKeepsClassesInUseAndReleasesStaleOnes) {
  CpuAllocator& a = cpu_allocator();
  if (!a.caching()) GTEST_SKIP() << "the host block cache is off in this build (sanitizers or DUET_CPU_CACHE=0)";
  a.release_cached();
  const int64_t limit = a.cache_limit();
  a.set_cache_limit(int64_t{2} << 20);  // room for two 1 MiB blocks
  {
    Tensor x = Tensor::empty({250000}), y = Tensor::empty({250000});
  }
  EXPECT_EQ(a.stats().cached, 2 << 20);
  { Tensor z = Tensor::empty({300000}); }  // class 1.25 MiB: no room, and the 1 MiB class is not stale
  EXPECT_EQ(a.stats().cached, 2 << 20);
  {
    Tensor x = Tensor::empty({250000});  // still served from the cache
    EXPECT_EQ(a.stats().cached, 1 << 20);
  }
  for (uint64_t i = 0; i <= CpuAllocator::kStaleAfter; ++i) Tensor t = Tensor::empty({16384});  // 64 KiB requests
  // Once the 1 MiB class went stale, the next 64 KiB block that needed room released it.
  EXPECT_EQ(a.stats().cached, 64 << 10);
  { Tensor z = Tensor::empty({300000}); }
  EXPECT_EQ(a.stats().cached, (64 << 10) + 1310720);
  a.set_cache_limit(limit);
  a.release_cached();
}

TEST(Allocator, CacheCanBeTurnedOff) {
  CpuAllocator& a = cpu_allocator();
  const bool was = a.caching();
  a.set_caching(false);
  { Tensor x = Tensor::empty({1 << 18}); }
  EXPECT_EQ(a.stats().cached, 0);
  a.set_caching(was);
}
