// Host-side logic of the CUDA backend, checked without a GPU in every CI run: the index arithmetic
// and kernel maths the .cu files call (same functions, run on the CPU here against the textbook
// formulas), the launch configuration, the convolution-algorithm cache key, the bookkeeping of the
// profiler's CUDA event timing, NVML telemetry's absent values, and the errors users get when no
// GPU or driver is present.
#include <gtest/gtest.h>

#ifdef DUET_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <sstream>
#include <utility>
#include "backends/cuda/arch_support.h"
#include "backends/cuda/conv_key.h"
#include "backends/cuda/planner.h"
#include "backends/cuda/cublas_library.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/event_timeline.h"
#include "backends/cuda/event_timer.h"
#include "backends/cuda/event_timer_core.h"
#include "backends/cuda/indexing.h"
#include "backends/cuda/kernel_math.h"
#include "backends/cuda/pinned_staging.h"
#include "backends/cuda/nvml_telemetry.h"
#include "backends/cuda/cuda_backend.h"
#include "engine/duet.h"
#include "engine/half.h"
#include "engine/rng.h"
#include "engine/profiler/machine.h"

using namespace duet;
using namespace duet::cuda;
namespace m = duet::cuda::math;

namespace {

// Offsets by the definition: sum over dims of index * stride, row-major linear index.
std::vector<int64_t> brute_offsets(const Shape& shape, const Shape& strides, int64_t linear) {
  int64_t off = 0;
  for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
    off += (linear % shape[d]) * strides[d];
    linear /= shape[d];
  }
  return {off};
}

}  // namespace

// ---- indexing ------------------------------------------------------------------------------------
TEST(CudaHostIndexing, MergesContiguousDimsAndDropsOnes) {
  const Shape shape{2, 1, 3, 4};
  const Shape st = contiguous_strides(shape);
  const Shape* s[1] = {&st};
  OffsetCalc<1> c;
  ASSERT_TRUE(make_offset_calc<1>(shape, s, c));
  EXPECT_EQ(c.ndim, 1);
  EXPECT_EQ(c.sizes[0], 24);
  EXPECT_TRUE(is_flat(c));
}

TEST(CudaHostIndexing, KeepsPermutedAndBroadcastDims) {
  const Shape shape{4, 3, 5};
  const Shape out = contiguous_strides(shape);
  const Shape bcast{0, 5, 1};      // a [3, 5] operand broadcast along dim 0
  const Shape permuted{1, 20, 4};  // dense, but with dim 0 innermost in memory
  const Shape* s[3] = {&out, &bcast, &permuted};
  OffsetCalc<3> c;
  ASSERT_TRUE(make_offset_calc<3>(shape, s, c));
  EXPECT_FALSE(is_flat(c));
  for (int64_t i = 0; i < numel_of(shape); ++i) {
    int64_t off[3];
    c.offsets(i, off);
    EXPECT_EQ(off[0], brute_offsets(shape, out, i)[0]);
    EXPECT_EQ(off[1], brute_offsets(shape, bcast, i)[0]);
    EXPECT_EQ(off[2], brute_offsets(shape, permuted, i)[0]);
  }
}

TEST(CudaHostIndexing, RandomLayoutsMatchTheDefinition) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int nd = 1 + static_cast<int>(rng() % 6);
    Shape shape(nd);
    for (auto& d : shape) d = 1 + static_cast<int64_t>(rng() % 4);
    // A random permutation of a contiguous layout, with some dims broadcast (stride 0).
    std::vector<int> perm(nd);
    for (int i = 0; i < nd; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    Shape strides(nd);
    int64_t acc = 1;
    for (int i = nd - 1; i >= 0; --i) {
      strides[perm[i]] = acc;
      acc *= shape[perm[i]];
    }
    for (auto& st : strides)
      if (rng() % 5 == 0) st = 0;
    const Shape out = contiguous_strides(shape);
    const Shape* s[2] = {&out, &strides};
    OffsetCalc<2> c;
    ASSERT_TRUE(make_offset_calc<2>(shape, s, c));
    for (int64_t i = 0; i < numel_of(shape); ++i) {
      int64_t off[2];
      c.offsets(i, off);
      ASSERT_EQ(off[0], i);
      ASSERT_EQ(off[1], brute_offsets(shape, strides, i)[0]) << "trial " << trial << " shape " << shape_str(shape);
    }
  }
}

// The CUDA cat walks each input's slab with the output's strides; here the same plan drives a host
// copy (what kern::copy does per element) into a channels-last output, as a DenseNet's
// concatenation along channels does, with inputs of both layouts, and along the batch dim.
TEST(CudaHostIndexing, ConcatIntoChannelsLastOutputPlacesEveryElement) {
  const int64_t N = 2, H = 3, W = 5;
  const std::vector<int64_t> channels{3, 4, 2};
  for (int64_t dim : {int64_t{1}, int64_t{0}}) {
    Shape out_shape{N, 0, H, W};
    if (dim == 1) {
      for (int64_t c : channels) out_shape[1] += c;
    } else {
      out_shape = {N * 3, 4, H, W};
    }
    const Shape out_st = channels_last_strides(out_shape);
    std::vector<double> out(static_cast<size_t>(out_shape[0] * out_shape[1] * H * W), -1.0);
    int64_t start = 0;
    for (size_t k = 0; k < 3; ++k) {
      const Shape in_shape = dim == 1 ? Shape{N, channels[k], H, W} : Shape{N, 4, H, W};
      const Shape in_st = k % 2 == 0 ? contiguous_strides(in_shape) : channels_last_strides(in_shape);
      // input element (n, c, h, w) holds a value naming its place in the concatenated output
      std::vector<double> in(static_cast<size_t>(in_shape[0] * in_shape[1] * H * W));
      for (int64_t n = 0; n < in_shape[0]; ++n)
        for (int64_t c = 0; c < in_shape[1]; ++c)
          for (int64_t h = 0; h < H; ++h)
            for (int64_t w = 0; w < W; ++w) {
              const int64_t on = dim == 0 ? n + start : n, oc = dim == 1 ? c + start : c;
              in[static_cast<size_t>(n * in_st[0] + c * in_st[1] + h * in_st[2] + w * in_st[3])] =
                  static_cast<double>(((on * out_shape[1] + oc) * H + h) * W + w);
            }
      ConcatSlab slab;
      ASSERT_TRUE(plan_concat_slab(out_st, in_shape, in_st, dim, start, slab));
      const int64_t count = in_shape[0] * in_shape[1] * H * W;
      for (int64_t i = 0; i < count; ++i) {
        int64_t off[2];
        slab.calc.offsets(i, off);
        out[static_cast<size_t>(slab.out_offset + off[0])] = in[static_cast<size_t>(off[1])];
      }
      start += in_shape[dim];
    }
    for (int64_t n = 0; n < out_shape[0]; ++n)
      for (int64_t c = 0; c < out_shape[1]; ++c)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t w = 0; w < W; ++w)
            ASSERT_EQ(out[static_cast<size_t>(n * out_st[0] + c * out_st[1] + h * out_st[2] + w * out_st[3])],
                      static_cast<double>(((n * out_shape[1] + c) * H + h) * W + w))
                << "dim " << dim << " at n " << n << " c " << c << " h " << h << " w " << w;
  }
}

TEST(CudaHostIndexing, TooManyUnmergeableDimsIsReported) {
  const Shape shape(10, 2);
  Shape strides(10);
  for (int i = 0; i < 10; ++i) strides[i] = int64_t(1) << (2 * (9 - i));  // gaps between every dim
  const Shape out = contiguous_strides(shape);
  const Shape* s[2] = {&out, &strides};
  OffsetCalc<2> c;
  EXPECT_FALSE(make_offset_calc<2>(shape, s, c));
  try {
    offset_calc<2>("copy", shape, s);
    FAIL() << "expected a duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 8 dims"), std::string::npos) << e.what();
  }
}

// ---- launch configuration -----------------------------------------------------------------------------
TEST(CudaHostLaunch, GridSizes) {
  EXPECT_EQ(m::grid_for(0), 0);
  EXPECT_EQ(m::grid_for(-5), 0);
  EXPECT_EQ(m::grid_for(1), 1);
  EXPECT_EQ(m::grid_for(256), 1);
  EXPECT_EQ(m::grid_for(257), 2);
  EXPECT_EQ(m::grid_for(int64_t(1) << 40), m::kMaxBlocks);  // grid-stride loops cover the rest
  EXPECT_EQ(m::grid_for(1000, 128), 8);
  EXPECT_EQ(m::row_block(1), 32);
  EXPECT_EQ(m::row_block(128), 32);
  EXPECT_EQ(m::row_block(129), 64);
  EXPECT_EQ(m::row_block(768), 256);
  EXPECT_EQ(m::row_block(100000), 512);
  EXPECT_TRUE(m::reduce_block_per_output(10, 5));        // few outputs: a block each
  EXPECT_TRUE(m::reduce_block_per_output(100000, 4096)); // long reductions: a block each
  EXPECT_FALSE(m::reduce_block_per_output(100000, 8));   // many short ones: a thread each
}

// Every plan must cover each reduced element exactly once, in splits that are never empty, with a
// launch the hardware accepts.
void expect_valid_plan(const m::ReducePlan& p, int64_t outputs, int64_t extent) {
  SCOPED_TRACE(testing::Message() << "outputs " << outputs << " extent " << extent);
  EXPECT_GE(p.blocks_x, 1);
  EXPECT_LE(p.blocks_x, m::kMaxBlocks);
  EXPECT_GE(p.splits, 1);
  EXPECT_LE(p.splits, m::kMaxReduceSplits);
  EXPECT_LE(int64_t(p.block_x) * p.block_y, 1024);
  EXPECT_EQ(p.block_x % 32, 0);  // whole warps: the shuffle trees assume them
  int64_t covered = 0;
  for (int64_t s = 0; s < p.splits; ++s) {
    int64_t b = 0, e = 0;
    m::reduce_split_range(p, extent, s, b, e);
    EXPECT_EQ(b, covered);
    EXPECT_TRUE(e > b || extent == 0) << "split " << s << " is empty";
    covered = e;
  }
  EXPECT_EQ(covered, extent);
}

TEST(CudaHostLaunch, ReducePlans) {
  using K = m::ReducePlan::Kind;
  const int sms = 132;  // an H100
  // A full reduction (GradScaler's amax of a 2.4M-element gradient): rows, spread over the GPU.
  m::ReducePlan p = m::plan_reduce(1, 2359296, false, true, sms);
  expect_valid_plan(p, 1, 2359296);
  EXPECT_EQ(p.kind, K::rows);
  EXPECT_EQ(p.block_x, 512);
  EXPECT_EQ(p.splits, 2359296 / (512 * 16));  // as many as fill the GPU, at least 16 elements a thread
  // Too little work to split: one block.
  p = m::plan_reduce(1, 1000, false, true, sms);
  expect_valid_plan(p, 1, 1000);
  EXPECT_EQ(p.splits, 1);
  // A linear layer's bias gradient, [4160, 192] summed over rows: 32-output column tiles, the rows
  // split so that the 6 tiles become enough blocks.
  p = m::plan_reduce(192, 4160, true, false, sms);
  expect_valid_plan(p, 192, 4160);
  EXPECT_EQ(p.kind, K::columns);
  EXPECT_EQ(p.block_x, 32);
  EXPECT_EQ(p.block_y, 16);
  EXPECT_EQ(p.blocks_x, 6);
  EXPECT_GT(p.splits, 1);
  EXPECT_GE(p.chunk, 16 * 16);  // each thread still sums at least 16 rows
  // A channels-last conv bias gradient, [64 * 32 * 32, 64]: columns too.
  p = m::plan_reduce(64, 65536, true, false, sms);
  expect_valid_plan(p, 64, 65536);
  EXPECT_EQ(p.kind, K::columns);
  EXPECT_EQ(p.blocks_x, 2);
  EXPECT_EQ(p.splits, 65536 / (16 * 16));
  // NCHW conv bias gradient: neither walk is one contiguous run, few outputs: a block per channel.
  p = m::plan_reduce(64, 65536, false, false, sms);
  expect_valid_plan(p, 64, 65536);
  EXPECT_EQ(p.kind, K::rows);
  // Row sums of many rows (softmax-like): a block per row, enough of them that nothing is split.
  p = m::plan_reduce(100000, 1000, false, true, sms);
  expect_valid_plan(p, 100000, 1000);
  EXPECT_EQ(p.kind, K::rows);
  EXPECT_EQ(p.splits, 1);
  // Many short strided reductions: a thread each, never split.
  p = m::plan_reduce(100000, 8, false, false, sms);
  expect_valid_plan(p, 100000, 8);
  EXPECT_EQ(p.kind, K::threads);
  EXPECT_EQ(p.splits, 1);
  // Short column sums (a [8, 100000] tensor over dim 0): threads, whose reads are coalesced already.
  p = m::plan_reduce(100000, 8, true, false, sms);
  EXPECT_EQ(p.kind, K::threads);
  // Without a multiprocessor count (the second pass) nothing is split.
  p = m::plan_reduce(1, 1 << 24, false, true, 0);
  expect_valid_plan(p, 1, 1 << 24);
  EXPECT_EQ(p.splits, 1);
  // An empty extent (a sum over a zero-size dim) is one empty split.
  p = m::plan_reduce(5, 0, false, true, sms);
  expect_valid_plan(p, 5, 0);
  // Sweep: every combination yields a valid plan.
  for (int64_t outputs : {1, 3, 31, 32, 33, 528, 4095, 4096, 70000, 5000000})
    for (int64_t extent : {0, 1, 7, 63, 64, 255, 4096, 65537, 3000000})
      for (int adj = 0; adj < 4; ++adj) {
        const m::ReducePlan q = m::plan_reduce(outputs, extent, adj & 1, adj & 2, sms);
        expect_valid_plan(q, outputs, extent);
        if (q.splits > 1) {  // the second pass over [outputs, splits] must fit one launch unsplit
          const m::ReducePlan second = m::plan_reduce(outputs, q.splits, false, true, 0);
          expect_valid_plan(second, outputs, q.splits);
        }
      }
}

// An invalid label recorded by a loss kernel is reported once, at the next synchronisation, with the
// row, the label, the class count and the call that waited; the record is then clear again.
TEST(CudaHostLabelErrors, APendingRecordBecomesOneMessage) {
  cuda::kern::LabelError r;
  EXPECT_FALSE(cuda::take_label_error(r, "copy").has_value());
  r.row = 5;
  r.label = -3;
  r.classes = 10;
  EXPECT_FALSE(cuda::take_label_error(r, "copy").has_value()) << "fields without the flag are not an error";
  r.pending = 1;
  const std::optional<std::string> m = cuda::take_label_error(r, "copy");
  ASSERT_TRUE(m.has_value());
  EXPECT_NE(m->find("target[5] = -3 is not a valid class label, expected 0 <= label < 10"), std::string::npos) << *m;
  EXPECT_NE(m->find("in copy"), std::string::npos) << *m;
  EXPECT_EQ(r.pending, 0);
  EXPECT_FALSE(cuda::take_label_error(r, "copy").has_value()) << "reported twice";
}

// Pinned staging without a GPU: fake memory, and events whose firing the test decides.
class FakeStagingRuntime final : public cuda::StagingRuntime {
public:
  void* allocate(size_t bytes) override {
    if (fail_allocations) return nullptr;
    ++allocations;
    blocks.push_back(std::make_unique<std::vector<char>>(bytes));
    return blocks.back()->data();
  }
  void release(void*) override { ++releases; }
  void* new_event() override {
    fired.push_back(false);
    return reinterpret_cast<void*>(fired.size());  // event k is fired[k - 1]
  }
  void record(void* e) override { fired[index(e)] = false; }
  bool finished(void* e) override { return fired[index(e)]; }
  void wait(void* e) override {
    ++waits;
    fired[index(e)] = true;
  }
  void fire_all() { std::fill(fired.begin(), fired.end(), true); }

  bool fail_allocations = false;
  int allocations = 0, releases = 0, waits = 0;
  std::vector<bool> fired;
  std::vector<std::unique_ptr<std::vector<char>>> blocks;

private:
  static size_t index(void* e) { return reinterpret_cast<size_t>(e) - 1; }
};

TEST(CudaHostStaging, BlocksAreReusedOnlyAfterTheirCopyHasRun) {
  FakeStagingRuntime rt;
  const size_t MiB = size_t(1) << 20;
  cuda::StagingBlocks staging(rt, 4 * MiB);
  void* first = nullptr;
  {
    cuda::StagingBlocks::Lease a = staging.acquire(1000);
    ASSERT_TRUE(a);
    first = a.get();
    a.queued();
  }
  EXPECT_EQ(staging.held_bytes(), MiB);  // rounded up to the smallest block
  {
    // The first block's copy has not run: a second block, not a wait.
    cuda::StagingBlocks::Lease b = staging.acquire(1000);
    ASSERT_TRUE(b);
    EXPECT_NE(b.get(), first);
    b.queued();
  }
  EXPECT_EQ(rt.allocations, 2);
  rt.fire_all();
  {
    cuda::StagingBlocks::Lease c = staging.acquire(1000);
    EXPECT_EQ(c.get(), first) << "a finished block is reused";
    EXPECT_EQ(rt.allocations, 2);
    c.queued();
  }
  EXPECT_EQ(rt.waits, 0);
}

TEST(CudaHostStaging, AtTheLimitItWaitsForTheOldestCopy) {
  FakeStagingRuntime rt;
  const size_t MiB = size_t(1) << 20;
  cuda::StagingBlocks staging(rt, 2 * MiB);
  std::vector<void*> seen;
  for (int i = 0; i < 2; ++i) {
    cuda::StagingBlocks::Lease l = staging.acquire(MiB);
    seen.push_back(l.get());
    l.queued();
  }
  cuda::StagingBlocks::Lease l = staging.acquire(MiB);  // both in flight, limit reached
  ASSERT_TRUE(l);
  EXPECT_EQ(rt.waits, 1);
  EXPECT_EQ(staging.waits(), 1);
  EXPECT_EQ(l.get(), seen[0]) << "the block queued first is waited for";
  EXPECT_EQ(rt.allocations, 2);
}

TEST(CudaHostStaging, FreeBlocksTooSmallAreGivenBackForABiggerOne) {
  FakeStagingRuntime rt;
  const size_t MiB = size_t(1) << 20;
  cuda::StagingBlocks staging(rt, 4 * MiB);
  for (int i = 0; i < 2; ++i) {
    cuda::StagingBlocks::Lease l = staging.acquire(MiB);
    l.queued();
  }
  rt.fire_all();
  cuda::StagingBlocks::Lease big = staging.acquire(3 * MiB);  // 4 MiB block: only after releasing both
  ASSERT_TRUE(big);
  EXPECT_EQ(rt.releases, 2);
  EXPECT_EQ(staging.held_bytes(), 4 * MiB);
}

TEST(CudaHostStaging, TooBigOrNoPinnedMemoryIsNotStaged) {
  FakeStagingRuntime rt;
  cuda::StagingBlocks staging(rt, size_t(1) << 20);
  EXPECT_FALSE(staging.acquire((size_t(1) << 20) + 1));
  EXPECT_FALSE(staging.acquire(0));
  rt.fail_allocations = true;
  EXPECT_FALSE(staging.acquire(100));
  rt.fail_allocations = false;
  {
    cuda::StagingBlocks::Lease l = staging.acquire(100);  // never queued (an error on the way)
    ASSERT_TRUE(l);
  }
  cuda::StagingBlocks::Lease again = staging.acquire(100);
  EXPECT_TRUE(again);
  EXPECT_EQ(rt.allocations, 1) << "an unqueued lease gives its block back as free";
  EXPECT_TRUE(rt.fired.empty()) << "no event is recorded for a block that was never queued";
}

// ---- kernel maths against the formulas ----------------------------------------------------------
TEST(CudaHostMath, ElementwiseOps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(m::apply_binary(BinaryOp::sub, 5.0, 3.0), 2.0);
  EXPECT_EQ(m::apply_binary(BinaryOp::div, 3.0, 4.0), 0.75);
  EXPECT_EQ(m::apply_binary(BinaryOp::gt, 2.0, 1.0), 1.0);
  EXPECT_EQ(m::apply_binary(BinaryOp::eq, 2.0, 1.0), 0.0);
  EXPECT_TRUE(std::isnan(m::apply_binary(BinaryOp::maximum, nan, 1.0)));
  EXPECT_TRUE(std::isnan(m::apply_binary(BinaryOp::minimum, 1.0, nan)));
  EXPECT_EQ(m::apply_scalar(ScalarOp::rsub, 2.0, 5.0), 3.0);
  EXPECT_EQ(m::apply_scalar(ScalarOp::rdiv, 4.0, 2.0), 0.5);
  EXPECT_EQ(m::apply_scalar(ScalarOp::pow, 3.0, 2.0), 9.0);
  EXPECT_FLOAT_EQ(m::apply_unary(UnaryOp::rsqrt, 4.0f), 0.5f);
  EXPECT_EQ(m::apply_unary(UnaryOp::square, -3.0), 9.0);
}

TEST(CudaHostMath, UniformValuesEqualTheReferenceBits) {
  // The reference backend's rule, written out: lo + (hi - lo) * u in double, rounded, kept < hi.
  auto reference = [](double lo, double hi, double u) {
    float v = static_cast<float>(lo + (hi - lo) * u);
    const float lo_t = static_cast<float>(lo), hi_t = static_cast<float>(hi);
    if (lo_t < hi_t && !(v < hi_t)) v = std::nextafter(hi_t, lo_t);
    return v;
  };
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = uniform01(42, i);
    EXPECT_EQ(m::uniform_value<float>(-2.0, 3.0, u), reference(-2.0, 3.0, u));
    EXPECT_EQ(m::uniform_value<double>(0.0, 1.0, u), u);
  }
  const double just_below_one = 1.0 - 0x1.0p-53;
  EXPECT_LT(m::uniform_value<float>(0.0, 1.0, just_below_one), 1.0f);  // rounding would give 1.0f
  const double z = m::box_muller(0.5, 0.25);  // cos(pi / 2) = 0
  EXPECT_NEAR(z, 0.0, 1e-12);
  EXPECT_NEAR(m::box_muller(1 - std::exp(-0.5), 0.0), 1.0, 1e-12);  // sqrt(-2 log(e^-0.5)) * cos(0)
}

// The GPU kernels round to f16 and bf16 with CUDA's intrinsics (__float2half_rn, __float2bfloat16_rn:
// hardware instructions on the device, the same functions on the host), the reference and cpu
// backends with engine/half.h: both must be round-to-nearest-even, bit for bit, over every exponent,
// subnormals, ties, overflow and NaN; and the widening back must be exact.
TEST(CudaHostMath, HalfAndBFloat16ConversionsMatchEngineHalf) {
  int64_t checked = 0;
  auto check = [&](uint32_t bits) {
    const float f = std::bit_cast<float>(bits);
    const uint16_t h = std::bit_cast<uint16_t>(__float2half_rn(f));
    const uint16_t b = std::bit_cast<uint16_t>(__float2bfloat16_rn(f));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_float(h)) && std::isnan(f16_to_float(float_to_f16(f)))) << std::hex << bits;
      EXPECT_TRUE(std::isnan(bf16_to_float(b)) && std::isnan(bf16_to_float(float_to_bf16(f)))) << std::hex << bits;
    } else {
      ASSERT_EQ(h, float_to_f16(f)) << "f16 of " << f << " (bits " << std::hex << bits << ")";
      ASSERT_EQ(b, float_to_bf16(f)) << "bf16 of " << f << " (bits " << std::hex << bits << ")";
    }
    ++checked;
  };
  // Every 257th bit pattern (all exponents, both signs), and around each f16/bf16 rounding boundary
  // of the f16 range: the ties and their neighbours.
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 257) check(static_cast<uint32_t>(bits));
  for (uint32_t e = 0x33000000u; e < 0x47800000u; e += 0x2000u)
    for (uint32_t d : {0x0fffu, 0x1000u, 0x1001u, 0x2fffu, 0x3000u, 0x3001u, 0x7fffu, 0x8000u, 0x8001u})
      check(e + d), check(0x80000000u | (e + d));
  EXPECT_GT(checked, 16000000);
  for (uint32_t v = 0; v <= 0xffffu; ++v) {
    const float wide_h = __half2float(std::bit_cast<__half>(static_cast<uint16_t>(v)));
    const float wide_b = __bfloat162float(std::bit_cast<__nv_bfloat16>(static_cast<uint16_t>(v)));
    if (std::isnan(wide_h)) {
      EXPECT_TRUE(std::isnan(f16_to_float(static_cast<uint16_t>(v))));
    } else {
      ASSERT_EQ(std::bit_cast<uint32_t>(wide_h), std::bit_cast<uint32_t>(f16_to_float(static_cast<uint16_t>(v)))) << v;
    }
    if (!std::isnan(wide_b)) {
      ASSERT_EQ(std::bit_cast<uint32_t>(wide_b), std::bit_cast<uint32_t>(bf16_to_float(static_cast<uint16_t>(v)))) << v;
    }
  }
}

TEST(CudaHostMath, AdamMatchesPyTorchFormula) {
  AdamParams p;
  p.lr = 1e-2;
  p.weight_decay = 0.1;
  for (bool decoupled : {false, true}) {
    p.decoupled = decoupled;
    double w = 0.7, mm = 0.0, vv = 0.0;  // kernel state
    double W = 0.7, M = 0.0, V = 0.0;    // formula state
    for (int64_t step = 1; step <= 5; ++step) {
      p.step = step;
      const double g = 0.3 - 0.1 * double(step);
      m::adam_update(w, g, mm, vv, m::make_adam_consts<double>(p));
      double gg = g;
      if (decoupled) W *= 1 - p.lr * p.weight_decay;
      else gg += p.weight_decay * W;
      M = p.beta1 * M + (1 - p.beta1) * gg;
      V = p.beta2 * V + (1 - p.beta2) * gg * gg;
      const double m_hat = M / (1 - std::pow(p.beta1, double(step)));
      const double denom = std::sqrt(V) / std::sqrt(1 - std::pow(p.beta2, double(step))) + p.eps;
      W -= p.lr * m_hat / denom;
      EXPECT_NEAR(w, W, 1e-14) << "step " << step << " decoupled " << decoupled;
    }
  }
}

TEST(CudaHostMath, SgdMatchesPyTorchFormula) {
  for (bool nesterov : {false, true}) {
    const m::SgdConsts<double> first{0.1, 0.01, 0.9, 1.0, nesterov, true, true};
    m::SgdConsts<double> later = first;
    later.first_step = false;
    double w = 1.0, buf = 0.0, W = 1.0, B = 0.0;
    for (int step = 0; step < 4; ++step) {
      const double g = 0.5 - 0.2 * step;
      m::sgd_update(w, g, &buf, step == 0 ? first : later);
      const double gg = g + 0.01 * W;
      B = step == 0 ? gg : 0.9 * B + gg;
      W -= 0.1 * (nesterov ? gg + 0.9 * B : B);
      EXPECT_NEAR(w, W, 1e-15);
      EXPECT_NEAR(buf, B, 1e-15);
    }
  }
  double w = 2.0;  // plain SGD ignores the buffer pointer
  m::sgd_update(w, 1.0, static_cast<double*>(nullptr), m::SgdConsts<double>{0.5, 0.0, 0.0, 1.0, false, true, false});
  EXPECT_EQ(w, 1.5);
}

TEST(CudaHostMath, CrossEntropyRowAndGradient) {
  const std::vector<double> x{0.5, -1.0, 2.0, 0.0};
  const int64_t C = 4, t = 2;
  const double ls = 0.1;
  double mx = -INFINITY, se = 0, sx = 0;
  for (double v : x) mx = std::max(mx, v), sx += v;
  for (double v : x) se += std::exp(v - mx);
  const double lse = mx + std::log(se);
  double expected = 0;
  for (int64_t c = 0; c < C; ++c) {
    const double q = (c == t ? 1 - ls : 0.0) + ls / C;  // the smoothed target distribution
    expected -= q * (x[c] - lse);
  }
  EXPECT_NEAR(m::cross_entropy_row(lse, x[t], sx, C, ls), expected, 1e-14);
  // The gradient sums to zero over the classes (softmax and targets both sum to one).
  double total = 0;
  for (int64_t c = 0; c < C; ++c) total += m::cross_entropy_grad(std::exp(x[c] - lse), c == t, C, ls, 1.0);
  EXPECT_NEAR(total, 0.0, 1e-14);
}

// ---- convolution algorithm cache key -------------------------------------------------------------
TEST(CudaHostConvKey, EqualityHashAndCache) {
  ConvKey a;
  a.n = 8, a.c = 3, a.h = 32, a.w = 32, a.o = 16, a.kh = 3, a.kw = 3;
  a.p.pad_h = a.p.pad_w = 1;
  ConvKey b = a;
  EXPECT_TRUE(a == b);
  EXPECT_EQ(ConvKeyHash{}(a), ConvKeyHash{}(b));
  for (auto mutate : std::vector<std::function<void(ConvKey&)>>{
           [](ConvKey& k) { k.pass = ConvPass::backward_data; }, [](ConvKey& k) { k.dtype = DType::f64; },
           [](ConvKey& k) { k.channels_last = true; }, [](ConvKey& k) { k.allow_tf32 = true; },
           [](ConvKey& k) { k.benchmark = true; },
           [](ConvKey& k) { k.device = 1; }, [](ConvKey& k) { k.n = 9; }, [](ConvKey& k) { k.p.groups = 2; },
           [](ConvKey& k) { k.p.dilation_w = 2; }, [](ConvKey& k) { k.p.stride_h = 2; }}) {
    ConvKey c = a;
    mutate(c);
    EXPECT_FALSE(a == c);
    EXPECT_NE(ConvKeyHash{}(a), ConvKeyHash{}(c));
  }
  EXPECT_NE(a.str().find("x[8, 3, 32, 32] w[16, 3, 3, 3]"), std::string::npos) << a.str();

  ConvAlgoCache cache;
  EXPECT_FALSE(cache.find(a).has_value());
  cache.insert(a, {1, 3, 4096});
  const auto hit = cache.find(b);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->algo, 1);
  EXPECT_EQ(hit->workspace, 4096u);
  EXPECT_EQ(cache.hits(), 1);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.size(), 1u);
}

// Issue 41: cuDNN 9's statuses are hierarchical (category * 1000 + detail), and an algorithm that
// cannot run a problem answers with a detail of NOT_SUPPORTED or BAD_PARAM; comparing with exactly
// CUDNN_STATUS_NOT_SUPPORTED / BAD_PARAM turned such an answer into a failed convolution instead of
// a try of the next algorithm.
TEST(CudaHostConvSearch, AnAlgorithmThatCannotRunIsACategoryNotACode) {
  for (const cudnnStatus_t st :
       {CUDNN_STATUS_NOT_SUPPORTED, CUDNN_STATUS_NOT_SUPPORTED_SHAPE, CUDNN_STATUS_NOT_SUPPORTED_ARCH_MISMATCH,
        CUDNN_STATUS_NOT_SUPPORTED_RUNTIME_PREREQUISITE_MISSING, CUDNN_STATUS_NOT_SUPPORTED_SHARED_MEMORY_INSUFFICIENT,
        CUDNN_STATUS_BAD_PARAM, CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER})
    EXPECT_TRUE(algorithm_cannot_run(st)) << static_cast<int>(st);
  for (const cudnnStatus_t st : {CUDNN_STATUS_SUCCESS, CUDNN_STATUS_NOT_INITIALIZED, CUDNN_STATUS_INTERNAL_ERROR,
                                 CUDNN_STATUS_INTERNAL_ERROR_DEVICE_ALLOCATION_FAILED, CUDNN_STATUS_EXECUTION_FAILED,
                                 CUDNN_STATUS_EXECUTION_FAILED_CUBLAS})
    EXPECT_FALSE(algorithm_cannot_run(st)) << static_cast<int>(st);
}

// A cached algorithm that cuDNN refuses later (the same shapes with a misaligned pointer) is dropped
// and the problem searched again; a hard failure is raised and the entry kept.
TEST(CudaHostConvSearch, ACachedAlgorithmCuDnnRefusesIsDroppedAndSearchedAgain) {
  ConvAlgoCache cache;
  ConvKey k;
  k.n = 2;
  k.c = 3;
  cache.insert(k, {1, 0, 0});
  int searches = 0;
  std::vector<int> ran;
  auto search = [&] {
    ++searches;
    cache.insert(k, {2, 0, 0});
  };
  auto no_failure = [](cudnnStatus_t st) { ADD_FAILURE() << "raised status " << static_cast<int>(st); };
  run_cached_or_search(
      cache, k, [&](const ConvChoice& c) { ran.push_back(c.algo); return CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER; },
      search, no_failure);
  EXPECT_EQ(searches, 1);
  ASSERT_TRUE(cache.find(k).has_value());
  EXPECT_EQ(cache.find(k)->algo, 2) << "the search's algorithm replaces the refused one";
  // The new choice runs from the cache without a search.
  run_cached_or_search(cache, k, [&](const ConvChoice& c) { ran.push_back(c.algo); return CUDNN_STATUS_SUCCESS; },
                       search, no_failure);
  EXPECT_EQ(searches, 1);
  EXPECT_EQ(ran, (std::vector<int>{1, 2}));
  // A failure no other algorithm mends is raised; the entry stays.
  int raised = 0;
  run_cached_or_search(cache, k, [](const ConvChoice&) { return CUDNN_STATUS_EXECUTION_FAILED; }, search,
                       [&](cudnnStatus_t) { ++raised; });
  EXPECT_EQ(raised, 1);
  EXPECT_EQ(searches, 1);
  EXPECT_TRUE(cache.find(k).has_value());
  // A problem seen for the first time is searched.
  ConvKey other = k;
  other.n = 4;
  run_cached_or_search(cache, other, [](const ConvChoice&) { return CUDNN_STATUS_SUCCESS; }, search, no_failure);
  EXPECT_EQ(searches, 2);
}

namespace {
// The device side of the event timer, faked: a clock, a stream that is busy or idle, and a loss's
// invalid-label record, which DeviceContext::synchronize reports (and clears) while
// DeviceContext::wait leaves it for the next synchronisation.
struct FakeEvents {
  int64_t clock = 0;
  bool busy = false;
  bool label_error = false;
  int waits = 0;
  std::vector<int> recorded;
  int device_count() { return 1; }
  int current_device() { return 0; }
  int64_t now_ns() { return clock; }
  bool stream_busy(int) { return busy; }
  void wait_for_stream(int) {
    ++waits;
    busy = false;
  }
  void synchronize(int i) {  // what the timer must not call: it takes the label error
    wait_for_stream(i);
    if (label_error) {
      label_error = false;
      throw Error("cross_entropy: target[0] = 7 is not a valid class label");
    }
  }
  void record(int, int slot) { recorded.push_back(slot); }
  void wait_event(int, int) {}
  double elapsed_ms(int, int, int) { return 1.0; }
};
}  // namespace

// Issue 41: a marker that finds its epoch older than 10 s opens a new one, which waits for the
// stream. mark() is noexcept: had that wait been DeviceContext::synchronize, an invalid label a
// loss recorded would have been raised there, swallowed, and lost to the .item() that reports it.
TEST(CudaHostEventTimer, ANewEpochWaitsWithoutTakingALossLabelError) {
  EventTimerCore<FakeEvents> timer;
  FakeEvents& dev = timer.events();
  EXPECT_GE(timer.mark(Device::cuda(0)), 0);  // opens the first epoch
  dev.busy = true;
  dev.label_error = true;                     // a cross_entropy found a bad label meanwhile
  dev.clock += kMaxEpochNs + 1;               // and the epoch has grown stale
  const int waits = dev.waits;
  EXPECT_GE(timer.mark(Device::cuda(0)), 0) << "the marker is recorded";
  EXPECT_EQ(dev.waits, waits + 1) << "the new epoch's reference waits for the stream";
  EXPECT_TRUE(dev.label_error) << "the label error is left for the next synchronisation to report";
  EXPECT_THROW(dev.synchronize(0), Error);
  // A fresh epoch inside 10 s records its markers without a wait.
  dev.busy = true;
  dev.clock += 1000;
  EXPECT_GE(timer.mark(Device::cuda(0)), 0);
  EXPECT_EQ(dev.waits, waits + 2) << "synchronize above waited once";
  EXPECT_EQ(timer.pending(), 3u);
}

// ---- the profiler's CUDA event timing: pool and clock bookkeeping -----------------------------------
TEST(CudaHostEventTimeline, MarkersBecomeHostTimesFromTheirEpochsReference) {
  EventTimeline tl;
  EXPECT_FALSE(tl.has_open_epoch());
  EXPECT_THROW(tl.add_marker(), Error);  // no reference to measure from
  const EventTimeline::Slot ref = tl.open_epoch(1'000'000);  // a step begins at host t = 1 ms
  EXPECT_TRUE(ref.fresh);
  const EventTimeline::Slot a = tl.add_marker(), b = tl.add_marker();
  EXPECT_TRUE(a.fresh && b.fresh);
  EXPECT_EQ(tl.pending(), 2u);
  EXPECT_EQ(tl.last_recorded(), b.index);
  EXPECT_EQ(tl.reference_of(a.index), ref.index);
  // cudaEventElapsedTime(ref, marker) in ms -> reference host time + elapsed.
  EXPECT_EQ(tl.resolve(a.index, 0.25), 1'250'000);
  EXPECT_EQ(tl.resolve(b.index, 1.5), 2'500'000);
  EXPECT_EQ(tl.resolve(tl.add_marker().index, -1e-4), 1'000'000);  // rounding noise before the reference
  EXPECT_EQ(tl.pending(), 0u);
  EXPECT_FALSE(tl.is_pending(a.index));
  EXPECT_THROW(tl.resolve(a.index, 1.0), Error);  // already resolved
  EXPECT_THROW(tl.reference_of(ref.index), Error);  // a reference is not a marker
}

TEST(CudaHostEventTimeline, PoolIsReusedAcrossStepsAndOldEpochsLiveUntilResolved) {
  EventTimeline tl;
  // Step 1: reference + 3 markers = 4 events created.
  tl.open_epoch(0);
  std::vector<int> step1;
  for (int i = 0; i < 3; ++i) step1.push_back(tl.add_marker().index);
  EXPECT_EQ(tl.pool_size(), 4u);
  // Step 2 begins before step 1's markers are resolved (another thread's events, say): the old
  // epoch's reference must survive until they are.
  const EventTimeline::Slot ref2 = tl.open_epoch(10'000'000);
  EXPECT_TRUE(ref2.fresh);
  const int m2 = tl.add_marker().index;
  EXPECT_EQ(tl.resolve(step1[0], 1.0), 1'000'000);
  EXPECT_EQ(tl.resolve(m2, 2.0), 12'000'000);
  EXPECT_EQ(tl.resolve(step1[1], 2.0), 2'000'000);
  EXPECT_EQ(tl.free_slots(), 3u);  // m2, step1[0] and step1[1] back; step 1's reference still needed
  EXPECT_EQ(tl.resolve(step1[2], 3.0), 3'000'000);
  EXPECT_EQ(tl.free_slots(), 5u);  // now the closed epoch's reference is recycled too (step 2's is open)
  // Step 3 reuses the pool: no new event.
  EXPECT_FALSE(tl.open_epoch(20'000'000).fresh);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(tl.add_marker().fresh);
  EXPECT_EQ(tl.pool_size(), 6u);
  // discard (profiler::clear): everything back to the pool, nothing pending, no epoch open.
  tl.reset();
  EXPECT_EQ(tl.pending(), 0u);
  EXPECT_FALSE(tl.has_open_epoch());
  EXPECT_EQ(tl.free_slots(), tl.pool_size());
  EXPECT_EQ(tl.last_recorded(), -1);
}

TEST(CudaHostEventTimeline, TimerIsRegisteredAndRecordsNothingWithoutADevice) {
  (void)backend(Backend::cuda);  // creating the backend registers its timer
  EXPECT_EQ(profiler::device_timer(Backend::cuda), &event_timer());
  if (device_count() > 0) GTEST_SKIP() << "a GPU is present: tests/test_cuda_device.cpp checks the device path";
  EXPECT_EQ(event_timer().mark(Device::cuda(0)), -1);  // never throws, even with no device
  EXPECT_EQ(event_timer().pending(), 0u);
}

// ---- errors, discovery and telemetry without a GPU -------------------------------------------------
TEST(CudaHostErrors, StatusMacrosNameCallOpAndReason) {
  try {
    DUET_CUDA_CHECK(cudaErrorMemoryAllocation, "conv2d");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("conv2d"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cudaErrorMemoryAllocation"), std::string::npos) << msg;
    EXPECT_NE(msg.find("batch size"), std::string::npos) << msg;
  }
  try {
    DUET_CUDNN_CHECK(CUDNN_STATUS_NOT_SUPPORTED, "batch_norm");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("batch_norm: cuDNN error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUDNN_STATUS_NOT_SUPPORTED"), std::string::npos) << msg;
  }
  try {
    DUET_CUBLAS_CHECK(CUBLAS_STATUS_INVALID_VALUE, "matmul");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("matmul: cuBLAS error"), std::string::npos) << msg;
    EXPECT_NE(msg.find("CUBLAS_STATUS_INVALID_VALUE"), std::string::npos) << msg;
  }
  EXPECT_EQ(cuda_version_str(13000), "CUDA 13.0");
  EXPECT_EQ(cuda_version_str(12040), "CUDA 12.4");
}

// A stand-in for the runtime's error state: a query's non-success status is recorded as the "last
// error" until cudaGetLastError reads (and clears) it, as the CUDA runtime does.
namespace {
cudaError_t fake_query_result = cudaSuccess;
cudaError_t fake_last = cudaSuccess;
cudaError_t fake_query(cudaStream_t) {
  if (fake_query_result != cudaSuccess) fake_last = fake_query_result;
  return fake_query_result;
}
cudaError_t fake_get_last_error() { return std::exchange(fake_last, cudaSuccess); }
}  // namespace

// The profiler opens a timing epoch with cudaStreamQuery; a busy stream answers cudaErrorNotReady.
// That answer must not linger as the last error, or the next kernel's launch check would throw
// "CUDA error 600" under an unrelated op's name.
TEST(CudaHostErrors, BusyStreamQueryLeavesNoStaleError) {
  fake_query_result = cudaErrorNotReady;
  EXPECT_TRUE(stream_busy(nullptr, "profiler", fake_query, fake_get_last_error));
  EXPECT_EQ(fake_get_last_error(), cudaSuccess) << "the next launch check would see the stale NotReady";

  fake_query_result = cudaSuccess;
  EXPECT_FALSE(stream_busy(nullptr, "profiler", fake_query, fake_get_last_error));
  EXPECT_EQ(fake_get_last_error(), cudaSuccess);

  fake_query_result = cudaErrorIllegalAddress;  // a real failure is reported, with the op's name
  try {
    stream_busy(nullptr, "profiler event timing", fake_query, fake_get_last_error);
    FAIL() << "an illegal address must throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("profiler event timing"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("cudaErrorIllegalAddress"), std::string::npos) << e.what();
  }
  fake_last = cudaSuccess;

  fake_last = cudaErrorInvalidValue;  // handled() clears only after a failure it was given
  EXPECT_EQ(handled(cudaSuccess, fake_get_last_error), cudaSuccess);
  EXPECT_EQ(fake_last, cudaErrorInvalidValue);
  EXPECT_EQ(handled(cudaErrorInvalidValue, fake_get_last_error), cudaErrorInvalidValue);
  EXPECT_EQ(fake_last, cudaSuccess);
}

TEST(CudaHostArch, BuildCoversTheGpusItHasCodeFor) {
  const std::string_view def = "75-real;80-real;90-real;90-virtual";
  EXPECT_TRUE(arch_supported(7, 5, def));   // T4
  EXPECT_TRUE(arch_supported(8, 0, def));   // A100
  EXPECT_TRUE(arch_supported(8, 6, def));   // RTX 30xx: sm_80 code runs on 8.x
  EXPECT_TRUE(arch_supported(8, 9, def));   // L4, RTX 40xx
  EXPECT_TRUE(arch_supported(9, 0, def));   // H100
  EXPECT_TRUE(arch_supported(12, 0, def));  // Blackwell: compute_90 PTX, compiled by the driver
  EXPECT_FALSE(arch_supported(7, 0, def));  // V100: no code (and CUDA 13 dropped it)
  EXPECT_FALSE(arch_supported(8, 0, "90-real"));
  EXPECT_FALSE(arch_supported(10, 0, "80-real;90-real"));  // machine code does not cross major versions
  EXPECT_TRUE(arch_supported(8, 6, "86"));                  // "86" is both machine code and PTX
  EXPECT_FALSE(arch_supported(8, 0, "86"));
  EXPECT_TRUE(arch_supported(9, 0, "80-virtual"));
  EXPECT_TRUE(arch_supported(7, 5, "native"));
  EXPECT_FALSE(arch_supported(7, 5, ""));
  EXPECT_FALSE(built_archs().empty());
}

TEST(CudaHostErrors, NoDeviceIsAClearErrorNotACrash) {
  const int n = cuda_device_count();  // must return, not throw or hang
  EXPECT_GE(n, 0);
  EXPECT_TRUE(backend_available(Backend::cuda));
  if (n > 0) {
    // A device index past the last one names how many exist.
    try {
      (void)Tensor::zeros({2}, TensorOptions().with_device(Device::cuda(n)));
      FAIL() << "expected a duet::Error for cuda:" << n;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
    }
    return;
  }
  EXPECT_NE(unavailable_reason().find("no CUDA device: "), std::string::npos);
  for (int index : {0, 3}) {
    try {
      (void)Tensor::zeros({2}, TensorOptions().with_device(Device::cuda(index)));
      FAIL() << "expected a duet::Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
    }
  }
  try {
    (void)Tensor::ones({2}).to(Device::cuda(0));
    FAIL() << "expected a duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA device"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(backend(Backend::cuda).synchronize());  // nothing was ever queued
}

TEST(CudaHostTelemetry, AbsentValuesAreAbsentNotZero) {
  const GpuTelemetry t = sample_telemetry(cuda_device_count());  // one past the last device
  EXPECT_FALSE(t.utilization_pct.has_value());
  EXPECT_FALSE(t.memory_used_bytes.has_value());
  EXPECT_FALSE(t.temperature_c.has_value());
  EXPECT_FALSE(t.power_w.has_value());
  EXPECT_FALSE(t.sm_clock_mhz.has_value());
  EXPECT_FALSE(t.note.empty());
  const std::string line = format_telemetry(t);
  EXPECT_NE(line.find("util n/a"), std::string::npos) << line;
  GpuTelemetry full;
  full.utilization_pct = 87;
  full.memory_used_bytes = uint64_t(10) << 30;
  full.memory_total_bytes = uint64_t(80) << 30;
  full.temperature_c = 64;
  full.power_w = 310.4;
  full.sm_clock_mhz = 1755;
  EXPECT_EQ(format_telemetry(full), "cuda:0 util 87% | mem 10.00 GiB / 80.00 GiB | 64 C | 310 W | SM 1755 MHz");
  EXPECT_FALSE(nvml_status().empty());
}

TEST(CudaHostSettings, Tf32Switch) {
  const bool before = cuda_allow_tf32();
  cuda_set_allow_tf32(true);
  EXPECT_TRUE(cuda_allow_tf32());
  cuda_set_allow_tf32(false);
  EXPECT_FALSE(cuda_allow_tf32());
  cuda_set_allow_tf32(before);
}

// cuBLAS is loaded at its first use, not at start-up (cublas_library.h): a process that has run no
// GPU matrix product has not mapped libcublas (linking it cost every process ~210 MiB of resident
// memory), and the first use loads it and resolves every entry point duet calls.
TEST(CudaHostCublas, LoadedAtFirstUseNotAtStartUp) {
  const auto mapped = [] {
    std::ifstream maps("/proc/self/maps");
    const std::string s((std::istreambuf_iterator<char>(maps)), std::istreambuf_iterator<char>());
    return s.find("libcublas") != std::string::npos;
  };
  EXPECT_FALSE(mapped()) << "libcublas is linked into the binary, or loaded before any GPU matrix product";
  EXPECT_FALSE(cuda::loaded_cublas_version().has_value());
  const cuda::CublasLibrary& blas = cuda::cublas_library("test");
  EXPECT_TRUE(mapped());
  int major = 0;
  ASSERT_EQ(blas.cublasGetProperty(MAJOR_VERSION, &major), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(major, CUBLAS_VER_MAJOR);
  const std::optional<std::string> version = cuda::loaded_cublas_version();
  ASSERT_TRUE(version.has_value());
  EXPECT_EQ(version->substr(0, version->find('.')), std::to_string(CUBLAS_VER_MAJOR)) << *version;
  EXPECT_STREQ(blas.cublasGetStatusName(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  EXPECT_NE(blas.cublasGemmStridedBatchedEx, nullptr);
  EXPECT_EQ(&cuda::cublas_library("test"), &blas);  // loaded once
}

// Every report's machine section says which CUDA runtime, cuDNN and cuBLAS (once loaded) the binary uses and
// which GPUs it sees; without a device the list is empty and the reason is given.
TEST(CudaHostMachineInfo, ReportsVersionsAndGpus) {
  const nlohmann::json m = profiler::machine_info();
  ASSERT_TRUE(m.contains("cuda") && m["cuda"].is_object()) << m.dump();
  const nlohmann::json& c = m["cuda"];
  EXPECT_TRUE(c["runtime"].is_string()) << c.dump();
  EXPECT_TRUE(c["cudnn"].is_string()) << c.dump();
  EXPECT_EQ(c["cudnn"].get<std::string>().substr(0, 2), "9.") << c.dump();
  EXPECT_EQ(c["allow_tf32"], cuda_allow_tf32()) << c.dump();
  EXPECT_EQ(c["cudnn_benchmark"], cuda_cudnn_benchmark()) << c.dump();
  ASSERT_TRUE(c["gpus"].is_array()) << c.dump();
  EXPECT_EQ(static_cast<int>(c["gpus"].size()), cuda_device_count()) << c.dump();
  if (cuda_device_count() == 0) {
    EXPECT_TRUE(c["unavailable"].is_string()) << c.dump();
  } else {
    EXPECT_TRUE(c["gpus"][0]["name"].is_string()) << c.dump();
    EXPECT_TRUE(c["unavailable"].is_null()) << c.dump();
  }
}

#else
TEST(CudaHost, NotBuilt) { GTEST_SKIP() << "built without the CUDA backend (configure with -DDUET_CUDA=ON)"; }
#endif
