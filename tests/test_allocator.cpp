// The allocator's counters: current and peak return to the expected values as tensors die, tags
// land in the right bucket.
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

// ---- the host cache -------------------------------------------------------------------------------

TEST(Allocator, SizeClassesBoundTheSlack) {
  EXPECT_EQ(CpuAllocator::size_class(4096), 4096u);  // below kCacheMin: exact
  EXPECT_EQ(CpuAllocator::size_class(size_t(1) << 20), size_t(1) << 20);
  EXPECT_EQ(CpuAllocator::size_class((size_t(1) << 20) + 1), (size_t(1) << 20) + (size_t(128) << 10));
  for (size_t b = CpuAllocator::kCacheMin; b < (size_t(64) << 20); b = b * 9 / 7 + 13) {
    const size_t c = CpuAllocator::size_class(b);
    EXPECT_GE(c, b);
    EXPECT_LE(c - b, b / 8) << b;
    EXPECT_EQ(c % CpuAllocator::kAlignment, 0u) << b;
  }
}

// Sets the cache limit for one test (caching is off by default under AddressSanitizer).
struct CacheLimit {
  size_t saved = cpu_allocator().cache_limit();
  explicit CacheLimit(size_t bytes) { cpu_allocator().set_cache_limit(bytes); }
  ~CacheLimit() { cpu_allocator().set_cache_limit(saved); }
};

TEST(Allocator, ReusesAFreedLargeBufferAndCountsItAsCached) {
  CacheLimit limit(size_t(64) << 20);
  CpuAllocator& a = cpu_allocator();
  a.release_cached();
  const MemoryStats s0 = a.stats();
  const int64_t hits0 = a.cache_hits();
  const size_t bytes = (size_t(1) << 20) + 4;  // 262145 floats, rounded up to a 1.125 MiB class
  void* first = nullptr;
  {
    Tensor x = Tensor::empty({262145});
    first = x.raw_data();
    EXPECT_EQ(a.stats().current - s0.current, static_cast<int64_t>(bytes));
    EXPECT_EQ(a.stats().cached, 0);
  }
  EXPECT_EQ(a.stats().current, s0.current);
  EXPECT_EQ(a.stats().cached, static_cast<int64_t>(CpuAllocator::size_class(bytes)));
  {
    Tensor y = Tensor::empty({270000});  // 1080000 bytes, same class: the same block
    EXPECT_EQ(y.raw_data(), first);
    EXPECT_EQ(a.cache_hits() - hits0, 1);
    EXPECT_EQ(a.stats().cached, 0);
    EXPECT_EQ(a.stats().current - s0.current, 1080000);  // live bytes as asked for
  }
  const MemoryStats s1 = a.stats();
  EXPECT_EQ(s1.allocations - s0.allocations, 2);  // every tensor counts, cached or not
  EXPECT_EQ(s1.frees - s0.frees, 2);
  EXPECT_EQ(a.release_cached(), CpuAllocator::size_class(bytes));
  EXPECT_EQ(a.stats().cached, 0);
  EXPECT_EQ(a.release_cached(), 0u);
}

TEST(Allocator, SmallBuffersAreNotCached) {
  CacheLimit limit(size_t(64) << 20);
  CpuAllocator& a = cpu_allocator();
  a.release_cached();
  { Tensor x = Tensor::empty({1024}); }
  EXPECT_EQ(a.stats().cached, 0);
}

TEST(Allocator, CacheLimitAndPeak) {
  CacheLimit limit(0);  // no caching
  CpuAllocator& a = cpu_allocator();
  a.release_cached();
  { Tensor x = Tensor::empty({1 << 18}); }
  EXPECT_EQ(a.stats().cached, 0);
  a.set_cache_limit(size_t(3) << 20);  // room for three 1 MiB blocks
  a.reset_peak();
  const int64_t base = a.stats().current;
  {
    Tensor x = Tensor::empty({1 << 18}), y = Tensor::empty({1 << 18}), z = Tensor::empty({1 << 18}),
           w = Tensor::empty({1 << 18});
  }
  EXPECT_EQ(a.stats().cached, int64_t(3) << 20);  // the fourth went back to the system
  EXPECT_EQ(a.stats().peak - base, int64_t(4) << 20);
  { Tensor x = Tensor::empty({1 << 18}); }  // served from the cache: peak and current unchanged
  EXPECT_EQ(a.stats().peak - base, int64_t(4) << 20);
  EXPECT_EQ(a.stats().current, base);
  a.set_cache_limit(size_t(1) << 20);  // shrinking below the cached bytes releases them
  EXPECT_EQ(a.stats().cached, 0);
}
