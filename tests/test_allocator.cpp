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
