// The op table (opcheck/op_table.h) on the CPU: every case's outputs and gradients on the `cpu`
// backend (oneDNN + OpenMP) against the `reference` backend (plain loops), and every case's gradients
// in f64 against central differences (opcheck/op_check.h has both modes). So a case added to the
// table is checked both ways here, on a GPU by tests/test_cuda_device.cpp, and timed by
// `duet selftest --mode perf` and bench_ops. Below the table: properties of the cpu backend itself
// (its kernel policies forced on, NaN handling, caching, threads).
#include <cmath>
#include <cstring>
#include <set>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>
#include "engine/frozen_copies.h"
#include "engine/ops/dispatch.h"
#include "opcheck/op_check.h"
#include "tests/test_support.h"
#ifdef DUET_HAVE_DNNL
#include "backends/cpu/bf16_speed.h"
#include "backends/cpu/common.h"
#include "backends/cpu/planner.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/direct_conv.h"
#include "backends/cpu/skinny_gemm.h"
#include "backends/cpu/small_gemm.h"
#include "backends/cpu/threads.h"
#include "backends/cpu/winograd_conv.h"
#endif

namespace duet {
namespace opcheck {
// gtest prints a parameter with this (found by argument-dependent lookup) instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }
}  // namespace opcheck

namespace {

using opcheck::Case;
using opcheck::Mode;
using testing::all_close;
using testing::random_tensor;
using testing::profiled_events;

#ifdef DUET_HAVE_DNNL
// oneDNN 2.6's Winograd kernels and its bf16 kernels need AVX-512 (avx512_core). Below it (AVX2: AMD
// Zen 3) the planner never gets a Winograd primitive (its cpu_caps() say so) and the backend sends
// bf16 convolutions to the reference loops (its support() says so), so a test of those paths has
// nothing to check there and says so.
#define DUET_SKIP_WITHOUT_AVX512(what) \
  if (!cpu::cpu_caps().avx512) GTEST_SKIP() << what << " needs AVX-512 in oneDNN 2.6; this CPU has none"
#define DUET_SKIP_WITHOUT_ONEDNN_BF16(what)                                                   \
  if (const std::string why = testing::cpu_bf16_convolutions_not_native(); !why.empty()) \
  GTEST_SKIP() << what << " is not taken here: " << why
#endif

void expect_cpu_matches_reference(const Case& c) {
  const opcheck::Outcome o = opcheck::check_conformance(c, opcheck::cpu_target(Backend::cpu));
  for (const std::string& p : o.problems) ADD_FAILURE() << p;
}

std::vector<Case> cases_of(Mode m) {
  std::vector<Case> v;
  for (Case& c : opcheck::all_cases())
    if (opcheck::skip_reason(c, opcheck::cpu_target(Backend::cpu), m).empty()) v.push_back(std::move(c));
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, CpuMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  expect_cpu_matches_reference(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Ops, Conformance, ::testing::ValuesIn(cases_of(Mode::conformance)), case_name);

class Gradients : public ::testing::TestWithParam<Case> {};

TEST_P(Gradients, MatchFiniteDifferencesInF64) {
  const opcheck::Outcome o = opcheck::check_gradients(GetParam());
  for (const std::string& p : o.problems) ADD_FAILURE() << p;
}

INSTANTIATE_TEST_SUITE_P(Ops, Gradients, ::testing::ValuesIn(cases_of(Mode::gradient)), case_name);

// The table's perf mode runs (a timed case gives a time, FLOPs from the cost model and bytes).
TEST(OpTable, PerfModeTimesACaseAndCountsItsCost) {
  for (const Case& c : opcheck::linalg_cases()) {
    if (c.name != "matmul_2d") continue;
    const opcheck::Timing t = opcheck::time_case(c, opcheck::cpu_target(Backend::reference), 0.0, 3);
    EXPECT_GE(t.reps, 3);
    EXPECT_GT(t.median_ms, 0.0);
    // [7, 5] x [5, 3]: 2*7*5*3 FLOPs forward, twice that backward, plus nothing else timed (one
    // output takes its weights as the gradient directly).
    EXPECT_DOUBLE_EQ(t.flops, 3 * 2.0 * 7 * 5 * 3);
    EXPECT_GT(t.bytes, 0.0);
    return;
  }
  FAIL() << "matmul_2d is not in the table";
}

// The table's names are unique (they name gtest cases and selftest lines), and every case runs in
// some mode on some backend.
TEST(OpTable, NamesAreUniqueAndEveryCaseHasAMode) {
  std::set<std::string> names;
  for (const Case& c : opcheck::all_cases()) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate case name " << c.name;
    bool some_mode = false;
    for (Mode m : {Mode::conformance, Mode::gradient, Mode::perf})
      for (Backend b : {Backend::reference, Backend::cpu, Backend::cuda})
        some_mode = some_mode || opcheck::skip_reason(c, opcheck::Target{Device::cpu(), b}, m).empty();
    EXPECT_TRUE(some_mode) << c.name;
  }
  EXPECT_GT(names.size(), 450u);
}

// Every case runs on the reference backend, those of the other backends only too (the f64 matrix
// cases of a GPU): a case that is itself broken shows up here, not first on somebody's GPU.
TEST(OpTable, EveryCaseRunsOnTheReferenceBackend) {
  for (const Case& c : opcheck::all_cases()) {
    if (c.perf_only) continue;
    try {
      const opcheck::Run r = opcheck::run_case(c, opcheck::cpu_target(Backend::reference));
      EXPECT_FALSE(r.outs.empty()) << c.name;
    } catch (const std::exception& e) {
      ADD_FAILURE() << c.name << ": " << e.what();
    }
  }
}

// Issue 41: each backend declares the dtypes it takes (BackendImpl::support) and the table follows
// the declaration: no case that runs on a backend sends it an op in a dtype it refuses; those that
// would are skipped with the op, the dtype and the reason. Checked for the GPU without one, by
// tracing each case on the reference loops as the cuda backend routes it. Before, ~420 bf16 cases
// would have reached the cuda backend's 16-bit refusals as hundreds of errors.
TEST(OpTable, NoCaseReachesABackendWithADTypeItRefuses) {
  for (const Backend b : {Backend::cpu, Backend::cuda}) {
    if (!backend_available(b)) {
      std::printf("[ note ] the %s backend is not built into this binary: not checked\n", backend_name(b));
      continue;
    }
    const BackendImpl& be = backend(b);
    const opcheck::Target t{b == Backend::cuda ? Device::cuda(0) : Device::cpu(), b};
    std::map<std::string, std::string> skipped;
    int runs = 0;
    for (const Case& c : opcheck::all_cases()) {
      if (c.perf_only) continue;
      if (const std::string why = opcheck::skip_reason(c, t, Mode::conformance); !why.empty()) {
        skipped[c.name] = why;
        continue;
      }
      ++runs;
      // Every case traced, also those whose dtype skip_reason does not trace for.
      for (const OpTrace::Entry& e : opcheck::trace_case(c, be))
        EXPECT_NE(be.support(e.op, e.dtype).coverage, Coverage::refused)
            << c.name << " reaches " << backend_name(b) << " with " << op_name(e.op) << " in " << dtype_name(e.dtype);
    }
    std::printf("[ note ] %s: %d cases run, %zu skipped as refused\n", backend_name(b), runs, skipped.size());
    if (b == Backend::cpu) {
      // oneDNN computes f32: the f64 matrix cases are the GPU's; the loops' f64 cases run.
      ASSERT_TRUE(skipped.count("conv2d_f64"));
      EXPECT_NE(skipped["conv2d_f64"].find("conv2d in f64"), std::string::npos) << skipped["conv2d_f64"];
      EXPECT_FALSE(skipped.count("sum_f64_large"));
      EXPECT_LT(skipped.size(), 10u);
    } else {
      // 16-bit maths beyond the matrix ops is refused, with its reason ...
      ASSERT_TRUE(skipped.count("act_relu_small_bf16")) << "act_relu_small_bf16 should be refused by the GPU";
      EXPECT_NE(skipped["act_relu_small_bf16"].find("in bf16: 16-bit types run only in conv2d, matmul and linear"),
                std::string::npos)
          << skipped["act_relu_small_bf16"];
      // ... while the convolutions and products in bf16 and f16, and autocast, run (the loss sums
      // their outputs in f32).
      for (const char* name : {"conv_3x3_same_bf16", "conv_1x1_nhwc_bf16", "conv2d_bf16_autocast_nhwc",
                               "conv2d_f16_autocast_groups2", "linear_bf16_autocast_vit_mlp", "conv2d_f64"})
        EXPECT_FALSE(skipped.count(name)) << name << ": " << skipped[name];
      EXPECT_GT(skipped.size(), 200u);
    }
  }
}

using opcheck::conv_cases;
using opcheck::linalg_cases;

// ---- backend properties --------------------------------------------------------------------------------

TEST(CpuBackend, F64OnOneDnnOpsNamesTheOp) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({1, 2, 5, 5}, 1), w = random_tensor({3, 2, 3, 3}, 2);
  const Tensor a = random_tensor({4, 5}, 3), b = random_tensor({5, 2}, 4);
  auto expect_error = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << " on f64 did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(op), std::string::npos) << msg;
      EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
      EXPECT_NE(msg.find("reference"), std::string::npos) << msg;
    }
  };
  expect_error([&] { conv2d(x, w); }, "conv2d");
  expect_error([&] { matmul(a, b); }, "matmul");
  expect_error([&] { softmax(a, -1); }, "softmax");
  expect_error([&] { layer_norm(a, Tensor(), Tensor()); }, "layer_norm");
  expect_error([&] { max_pool2d(x, Pool2dParams{}); }, "max_pool2d");
  // The loop ops do run in f64.
  EXPECT_TRUE(all_close(add(a, a), mul(a, 2.0), 0, 0));
}

// argmax's NaN rule (the first NaN wins) and first-of-ties in every walk of the cpu kernel:
// lines along a contiguous dim and runs of outputs scanned together.
TEST(CpuBackend, ArgmaxNaNAndTiesMatchReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  const Shape shape{3, 5, 4, 6};
  std::vector<float> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7) % 5);  // many ties
  for (size_t i = 3; i < v.size(); i += 17) v[i] = NAN;
  for (const MemoryFormat mf : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    const Tensor x = Tensor::from_vector<float>(v, shape).contiguous(mf);
    for (int64_t d = 0; d < 4; ++d) {
      Tensor got, want;
      {
        BackendGuard g(DeviceType::cpu, Backend::cpu);
        got = argmax(x, d);
      }
      {
        BackendGuard g(DeviceType::cpu, Backend::reference);
        want = argmax(x, d);
      }
      EXPECT_EQ(got.to_vector<int64_t>(), want.to_vector<int64_t>()) << "dim " << d << " channels_last " << (mf == MemoryFormat::channels_last);
    }
  }
}

// NaN and infinities through the SIMD elementwise loops (long enough for the vector body):
// NaN propagates through relu, clamp, maximum/minimum and the smooth activations as in
// PyTorch; the loop ops match the reference bit for bit, the transcendental ones closely.
TEST(CpuBackend, ElementwiseNaNMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  const float special[] = {NAN, -1.0f, 2.0f, -INFINITY, INFINITY, 0.0f, -0.0f, 0.25f, 7.0f};
  std::vector<float> v(70001);
  for (size_t i = 0; i < v.size(); ++i) v[i] = special[(i * 5) % 9];
  const Tensor x = Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())});
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool exact;
  };
  const std::vector<Op> ops = {
      {"relu", [](const Tensor& t) { return relu(t); }, true},
      {"relu6", [](const Tensor& t) { return relu6(t); }, true},
      {"clamp_min", [](const Tensor& t) { return clamp_min(t, 0.5); }, true},
      {"clamp_max", [](const Tensor& t) { return clamp_max(t, 0.5); }, true},
      {"maximum", [](const Tensor& t) { return maximum(t, mul(t, -1.0)); }, true},
      {"minimum", [](const Tensor& t) { return minimum(mul(t, -1.0), t); }, true},
      {"abs", [](const Tensor& t) { return abs(t); }, true},
      {"neg_mul", [](const Tensor& t) { return neg(mul(t, 0.5)); }, true},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, false},
      {"silu", [](const Tensor& t) { return silu(t); }, false},
      {"hardswish", [](const Tensor& t) { return hardswish(t); }, false},
      {"gelu", [](const Tensor& t) { return gelu(t); }, false},
  };
  for (const Op& op : ops) {
    std::vector<float> got, want;
    {
      BackendGuard g(DeviceType::cpu, Backend::cpu);
      got = op.f(x).to_vector<float>();
    }
    {
      BackendGuard g(DeviceType::cpu, Backend::reference);
      want = op.f(x).to_vector<float>();
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = std::memcmp(&got[i], &want[i], sizeof(float)) == 0 || (std::isnan(got[i]) && std::isnan(want[i]));
      const bool close = same || (!std::isnan(got[i]) && !std::isnan(want[i]) && std::isinf(got[i]) == std::isinf(want[i]) &&
                                  std::abs(got[i] - want[i]) <= 1e-6 + 1e-6 * std::abs(want[i]));
      ASSERT_TRUE(op.exact ? same : close) << op.name << " at " << i << ": " << got[i] << " vs " << want[i] << " (x = " << v[i] << ")";
    }
  }
}

// GELU (erf) in f32 against the reference in f64 on a dense grid: the cpu kernel keeps relative
// accuracy into the negative tail (where 0.5 x (1 + erf(x / sqrt2)) in f32 has a relative error
// of 5% at x = -5), and its derivative is accurate in absolute terms.
TEST(CpuBackend, GeluErfF32IsAccurate) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  std::vector<float> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(-8.0f + 20.0f * static_cast<float>(i) / 200000.0f);
  const std::vector<double> xd(xs.begin(), xs.end());
  const Shape shape{static_cast<int64_t>(xs.size())};
  auto run = [&](Backend b, const Tensor& x) {
    BackendGuard guard(DeviceType::cpu, b);
    Tensor leaf = x.detach();
    leaf.set_requires_grad(true);
    const Tensor y = gelu(leaf);
    sum(y).backward();
    return std::make_pair(y.to_vector<double>(), leaf.grad().to_vector<double>());
  };
  const auto [y, dy] = run(Backend::cpu, Tensor::from_vector<float>(xs, shape));
  const auto [y64, dy64] = run(Backend::reference, Tensor::from_vector<double>(xd, shape, TensorOptions(DType::f64)));
  double max_rel = 0, max_abs_grad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    // The f64 reference itself cancels in 1 + erf below x = -5 (relative error 1e-10 at -5).
    if (xs[i] >= -5.0f && y64[i] != 0) max_rel = std::max(max_rel, std::abs(y[i] - y64[i]) / std::abs(y64[i]));
    max_abs_grad = std::max(max_abs_grad, std::abs(dy[i] - dy64[i]));
  }
  EXPECT_LT(max_rel, 1e-6);       // measured 3.8e-7 (AVX-512)
  EXPECT_LT(max_abs_grad, 5e-7);  // measured 1.8e-7
}

#ifdef DUET_HAVE_DNNL
// The shapes a model's tail produces ([N, C, 1, 1] maps, gradients that reach them with NCHW
// strides) must still land on oneDNN's optimised kernels: a reference kernel there cost
// DenseNet-121 3% of its step. Every op of this tail reports which implementation ran.
TEST(CpuBackend, ModelTailRunsNoReferenceKernel) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({8, 64, 2, 2}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  Tensor g = Tensor::ones({64}).set_requires_grad(true), b = Tensor::zeros({64}).set_requires_grad(true);
  Tensor w1 = random_tensor({32, 64, 1, 1}, 2, DType::f32).set_requires_grad(true);
  Tensor w3 = random_tensor({16, 32, 3, 3}, 3, DType::f32).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  BatchNormParams bp;
  Tensor h = avg_pool2d(x, Pool2dParams{});
  h = relu(batch_norm(h, g, b, Tensor(), Tensor(), bp));
  h = conv2d(h, w1, Tensor(), Conv2dParams{});
  h = conv2d(h, w3, Tensor(), Conv2dParams{1, 1, 1, 1});  // a 3x3 kernel on a 1x1 map
  sum(adaptive_avg_pool2d(h, 1, 1)).backward();
  profiler::enable(false);
  int with_impl = 0;
  for (const OpEvent& e : profiler::collect()) {
    if (e.impl.empty()) continue;
    ++with_impl;
    EXPECT_EQ(e.impl.find("ref"), std::string::npos) << e.name << " " << e.shapes << " ran " << e.impl;
    // oneDNN's gemm-based convolution is its slow fallback; below AVX-512 its matmul is its jit
    // sgemm ("matmul/gemm:jit"), the fastest it has there.
    const bool sgemm_matmul = !cpu::cpu_caps().avx512 && e.impl.rfind("matmul/gemm:jit", 0) == 0;
    if (!sgemm_matmul) {
      EXPECT_EQ(e.impl.find("gemm"), std::string::npos) << e.name << " " << e.shapes << " ran " << e.impl;
    }
  }
  profiler::clear();
  EXPECT_GE(with_impl, 7);  // pool fwd/bwd, bn fwd/bwd, 2 convs x 3 passes
}

// A DenseNet block under bf16 autocast on channels-last maps: the gradients of cat's inputs are
// strided channel slices, summed where a feature map feeds several layers, and the head's global
// pooling is bf16. None of it may land on the reference loops (the strided gradient sums did, and
// cost DenseNet-121 a fifth of its bf16 step).
TEST(CpuBackend, Bf16DenseBlockRunsNoReferenceKernel) {
  DUET_SKIP_WITHOUT_ONEDNN_BF16("a bf16 convolution off the reference loops");
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({4, 16, 6, 6}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  Tensor w1 = random_tensor({8, 16, 3, 3}, 2, DType::f32).set_requires_grad(true);
  Tensor w2 = random_tensor({8, 24, 3, 3}, 3, DType::f32).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  {
    AutocastGuard amp(DType::bf16);
    const Tensor h = relu(x.to(DType::bf16));  // a bf16 feature map, as a conv or pool hands it on
    const Tensor f1 = cat({h, conv2d(h, w1, Tensor(), Conv2dParams{1, 1, 1, 1})}, 1);
    const Tensor f2 = cat({f1, conv2d(f1, w2, Tensor(), Conv2dParams{1, 1, 1, 1})}, 1);
    sum(adaptive_avg_pool2d(f2, 1, 1).to(DType::f32)).backward();
  }
  profiler::enable(false);
  int bf16_ops = 0, sums = 0;
  std::string all;
  for (const OpEvent& e : profiler::collect()) {
    all += fmt::format("{}({}) ", e.name, dtype_name(e.dtype));
    if (e.dtype != DType::bf16) continue;
    ++bf16_ops;
    sums += std::string(e.name) == "add" && e.phase == Phase::backward;
    EXPECT_EQ(e.impl.find("reference"), std::string::npos) << e.name << " " << e.shapes << " ran " << e.impl;
  }
  profiler::clear();
  EXPECT_GE(sums, 2) << all;  // h and f1 each receive two gradients
  EXPECT_GE(bf16_ops, 12) << all;
}

// One training step of a small conv net; the second identical step must find every primitive in
// the cache.
TEST(CpuBackend, SecondTrainingStepCreatesNoPrimitive) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  Tensor w1 = random_tensor({8, 3, 3, 3}, 1, DType::f32).set_requires_grad(true);
  Tensor g1 = Tensor::ones({8}).set_requires_grad(true), b1 = Tensor::zeros({8}).set_requires_grad(true);
  Tensor w2 = random_tensor({16, 8, 3, 3}, 2, DType::f32).set_requires_grad(true);
  Tensor fc = random_tensor({10, 16}, 3, DType::f32).set_requires_grad(true);
  Tensor fb = Tensor::zeros({10}).set_requires_grad(true);
  Tensor rm = Tensor::zeros({8}), rv = Tensor::ones({8});
  const Tensor x = random_tensor({4, 3, 16, 16}, 4, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor y = Tensor::from_vector<int64_t>({1, 3, 5, 7}, {4}, TensorOptions(DType::i64));
  std::vector<Tensor> params{w1, g1, b1, w2, fc, fb};
  std::vector<Tensor> bufs;
  for (const Tensor& p : params) bufs.push_back(Tensor::zeros(p.shape()));
  auto step = [&](bool first) {
    BatchNormParams bp;
    Tensor h = relu(batch_norm(conv2d(x, w1, Tensor(), Conv2dParams{1, 1, 1, 1}), g1, b1, rm, rv, bp));
    h = max_pool2d(h, Pool2dParams{});
    h = gelu(conv2d(h, w2, Tensor(), Conv2dParams{2, 2, 1, 1}));
    h = adaptive_avg_pool2d(h, 1, 1).flatten(1);
    Tensor loss = cross_entropy(softmax(linear(h, fc, fb), -1), y, 0.1);
    loss.backward();
    SgdParams sp;
    sp.momentum = 0.9;
    for (size_t i = 0; i < params.size(); ++i) {
      sgd_step_(params[i], params[i].grad(), bufs[i], sp, first);
      params[i].zero_grad();
    }
  };
  step(true);
  cpu_primitive_cache_reset_stats();
  step(false);
  const CpuCacheStats s = cpu_primitive_cache_stats();
  EXPECT_EQ(s.misses, 0) << "the second step created primitives";
  EXPECT_GT(s.hits, 5);
}

// Sets one of the cpu backend's kernel policies for a test; the automatic choice comes back after.
struct ScopedPolicy {
  void (*set)(cpu::KernelPolicy);
  ScopedPolicy(void (*s)(cpu::KernelPolicy), cpu::KernelPolicy p) : set(s) { set(p); }
  ~ScopedPolicy() { set(cpu::KernelPolicy::automatic); }
};

// duet's own depthwise kernels (backends/cpu/depthwise.h) on every depthwise case, forced on
// (the automatic policy gives them only the shapes oneDNN has no depthwise kernel for).
TEST(CpuBackend, OwnDepthwiseKernelsMatchReference) {
  ScopedPolicy always(cpu::set_depthwise_policy, cpu::KernelPolicy::always);
  int n = 0, n_bf16 = 0;
  for (const Case& c : conv_cases()) {
    if (c.name.find("depthwise") == std::string::npos) continue;
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
    ++n;
  }
  for (const Case& c : opcheck::bf16_cases()) {  // bf16 storage, f32 sums (MobileNet under autocast)
    if (c.name.find("depthwise") == std::string::npos) continue;
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
    ++n_bf16;
  }
  EXPECT_GE(n, 15);
  EXPECT_GE(n_bf16, 15);
}

// Every convolution case, and its bf16 twin.
std::vector<Case> conv_cases_f32_and_bf16() {
  std::vector<Case> cases = conv_cases();
  for (Case& c : opcheck::bf16_cases())
    if (c.name.rfind("conv", 0) == 0) cases.push_back(std::move(c));
  return cases;
}

// Winograd (backends/cpu/planner.h) on every dense 3x3 stride-1 case, forced on, within
// the conformance tolerance, f32 and bf16 (computed in f32, with and without a bias and a fused
// ReLU).
TEST(CpuBackend, WinogradConvolutionMatchesReference) {
  ScopedPolicy always(cpu::set_winograd_policy, cpu::KernelPolicy::always);
  int n = 0, n_bf16 = 0;
  for (const Case& c : conv_cases_f32_and_bf16()) {
    const bool dense3x3 = c.name.find("3x3_same") != std::string::npos || c.name.find("resnet_block") != std::string::npos ||
                          c.name.find("3x3_4x4_out") != std::string::npos || c.name.find("3x3_32ch") != std::string::npos ||
                          c.name.find("3x3_on_1x1") != std::string::npos;
    if (!dense3x3) continue;
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
    ++(c.dtype == DType::bf16 ? n_bf16 : n);
  }
  EXPECT_GE(n, 15);
  EXPECT_GE(n_bf16, 15);
}

// Every conv case, f32 and bf16, with one of the planner's policies forced on: the cases its
// algorithm cannot run must still run (on oneDNN's convolution), the others on it. Returns how many
// case names `counted` accepts.
int forced_conv_cases_match_reference(void (*set_policy)(cpu::KernelPolicy),
                                      const std::function<bool(const std::string&)>& counted) {
  ScopedPolicy always(set_policy, cpu::KernelPolicy::always);
  int n = 0;
  for (const Case& c : conv_cases_f32_and_bf16()) {
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
    n += counted(c.name);
  }
  return n;
}
// A case-name test for forced_conv_cases_match_reference: the name contains `part`.
std::function<bool(const std::string&)> name_has(const char* part) {
  return [part](const std::string& name) { return name.find(part) != std::string::npos; };
}

// Pointwise convolutions as matrix products (backends/cpu/planner.h), forced on for every
// conv case, f32 and bf16: the cases the shape or layout rules out must still run (on oneDNN's
// convolution), the others on matmul.
TEST(CpuBackend, PointwiseConvolutionsAsGemmMatchReference) {
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_pointwise_gemm_policy, name_has("1x1")), 20);
}

// Weight gradients of kernels larger than 1x1 on an im2col matrix (backends/cpu/planner.h),
// forced on for every conv case, f32 and bf16: the channels-last ones (strided, padded, dilated,
// any kernel) take it, the others (NCHW, grouped, with a bias gradient) keep oneDNN's kernel.
TEST(CpuBackend, Im2colWeightGradientsMatchReference) {
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_im2col_weight_gradient_policy, name_has("_nhwc")), 20);
}

// Forwards of kernels larger than 1x1 as im2col times the weights' [O, KH*KW*C] matrix (planner.h),
// forced on for every conv case, f32 and bf16: the channels-last ones of one group take it
// (strided, padded, dilated, with the bias and the fused epilogue), the others keep oneDNN's kernel.
TEST(CpuBackend, Im2colForwardsMatchReference) {
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_im2col_forward_policy, name_has("_nhwc")), 20);
}

// duet's direct kernel (backends/cpu/direct_conv.h) forced on for every conv case, f32 and bf16:
// the forwards, the stride-1 data gradients and the weight gradients (without a bias gradient) of
// the channels-last f32 ones of one group take it, the others (bf16, NCHW, grouped, strided data
// gradients, bias gradients) keep their kernels.
TEST(CpuBackend, OwnDirectMatchesReferenceOnEveryConvCase) {
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's direct convolution needs AVX2 and FMA, which this CPU lacks";
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_own_direct_policy, name_has("_nhwc")), 20);
}

// A frozen weight (inference) in NCHW order runs the im2col forward on its OHWI matrix, copied once
// per freeze and kept: the second forward copies nothing, and the result is the unfrozen weight's
// to rounding (the product reads a packed copy of the kept matrix, on oneDNN's or duet's kernel).
TEST(CpuBackend, Im2colForwardKeepsAFrozenWeightsMatrix) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "needs the cpu backend";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  ScopedPolicy always(cpu::set_im2col_forward_policy, cpu::KernelPolicy::always);
  NoGradGuard no_grad;
  const Tensor x = random_tensor({2, 32, 4, 4}, 1, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor w = random_tensor({48, 32, 3, 3}, 2, DType::f32);
  const Tensor b = random_tensor({48}, 3, DType::f32);
  Conv2dParams p{1, 1, 1, 1};
  p.act = Activation::relu;
  const Tensor plain = conv2d(x, w, b, p);
  w.freeze();
  const Tensor first = conv2d(x, w, b, p);
  profiler::clear();
  profiler::enable(true);
  const Tensor second = conv2d(x, w, b, p);
  profiler::enable(false);
  int copies = 0;
  std::string impl;
  for (const OpEvent& e : profiler::collect()) {
    copies += std::string(e.name) == "copy";
    if (std::string(e.name).rfind("conv2d", 0) == 0) impl = e.impl;
  }
  profiler::clear();
  w.unfreeze();
  EXPECT_EQ(copies, 0) << "the frozen weight's OHWI matrix is kept";
  // The product on oneDNN's matmul, or below AVX-512 on duet's direct kernel as one (direct_conv.h).
  EXPECT_TRUE(impl.rfind("matmul/", 0) == 0 || impl.rfind(cpu::kOwnDirectMatmul, 0) == 0) << impl;
  EXPECT_NE(impl.find("[im2col: DUET_IM2COL_FORWARD=always]"), std::string::npos) << impl;
  EXPECT_TRUE(all_close(first, plain, 1e-5, 1e-5));  // sums of 288 products of values in [-1, 1)
  EXPECT_TRUE(all_close(second, first, 0, 0));
}

// The implementation of run()'s last op named `op`.
std::string profiled_impl(const std::string& op, const std::function<void()>& run) {
  std::string impl;
  for (const OpEvent& e : profiled_events(run))
    if (e.name == op) impl = e.impl;
  return impl;
}

// duet's own AVX2 direct forward (backends/cpu/direct_conv.h), forced on, against the reference
// backend: 1x1 to 7x7 kernels, strides, padding and dilation, channel counts that leave a partial
// 16-channel tile or 6-pixel tile, sums over several chunks of input channels (a 3x3 kernel takes
// 64 channels per chunk, a 1x1 576), a bias, a residual laid out as y (added in the kernel) or in
// NCHW (a pass after), relu in the kernel and relu6 after it.
TEST(CpuBackend, OwnDirectForwardMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "needs the cpu backend";
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's direct convolution needs AVX2 and FMA, which this CPU lacks";
  ScopedPolicy always(cpu::set_own_direct_policy, cpu::KernelPolicy::always);
  enum Residual { none, like_y, nchw };
  struct Shape {
    int64_t N, C, H, W, O, K, stride, pad, dilation;
    bool bias;
    Residual residual;
    std::optional<Activation> act;
  };
  const std::vector<Shape> shapes = {
      {1, 64, 4, 4, 64, 3, 1, 1, 1, true, none, Activation::relu},
      {2, 3, 9, 7, 40, 3, 1, 1, 1, false, none, std::nullopt},
      {3, 17, 8, 8, 5, 1, 1, 0, 1, true, like_y, Activation::relu},
      {1, 150, 6, 5, 33, 3, 2, 1, 1, true, like_y, std::nullopt},
      {2, 8, 11, 11, 16, 5, 2, 2, 1, false, nchw, Activation::relu},
      {1, 20, 13, 13, 24, 7, 2, 3, 1, true, none, Activation::relu6},
      {2, 16, 9, 9, 32, 3, 1, 2, 2, false, like_y, Activation::relu},
      {1, 600, 2, 2, 48, 1, 1, 0, 1, true, none, std::nullopt},
  };
  uint64_t seed = 10;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(fmt::format("[{}, {}, {}, {}] * [{}, {}, {k}, {k}] stride {} pad {} dilation {}", s.N, s.C, s.H, s.W,
                             s.O, s.C, s.stride, s.pad, s.dilation, fmt::arg("k", s.K)));
    const int64_t OH = (s.H + 2 * s.pad - s.dilation * (s.K - 1) - 1) / s.stride + 1;
    const int64_t OW = (s.W + 2 * s.pad - s.dilation * (s.K - 1) - 1) / s.stride + 1;
    const Tensor x = random_tensor({s.N, s.C, s.H, s.W}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    const Tensor w = random_tensor({s.O, s.C, s.K, s.K}, ++seed, DType::f32, -0.1, 0.1);
    const Tensor b = s.bias ? random_tensor({s.O}, ++seed, DType::f32) : Tensor();
    Tensor r;
    if (s.residual != none) r = random_tensor({s.N, s.O, OH, OW}, ++seed, DType::f32);
    if (s.residual == like_y) r = r.contiguous(MemoryFormat::channels_last);
    Conv2dParams p{s.stride, s.stride, s.pad, s.pad, s.dilation, s.dilation};
    p.act = s.act;
    Tensor y, ref;
    std::string impl;  // the op is conv2d, conv2d+relu, conv2d+add+relu, ...
    for (const OpEvent& e : profiled_events([&] {
           BackendGuard guard(DeviceType::cpu, Backend::cpu);
           y = conv2d(x, w, b, p, r);
         }))
      if (std::string(e.name).starts_with("conv2d")) impl = e.impl;
    {
      BackendGuard guard(DeviceType::cpu, Backend::reference);
      ref = conv2d(x, w, b, p, r);
    }
    EXPECT_NE(impl.find("duet:direct_nhwc_avx2 [duet direct: DUET_OWN_DIRECT=always]"), std::string::npos) << impl;
    EXPECT_TRUE(all_close(y, ref, 1e-4, 1e-4));
  }
}

// The data gradient of stride-1 layers on the direct kernel (dy convolved with the flipped weights,
// packed straight from w), forced on, against the reference backend: 3x3 to 7x7 kernels, every
// padding from 0 to d * (K - 1), dilation, channel counts that leave partial tiles, several chunks,
// a weight in NCHW and one channels-last.
TEST(CpuBackend, OwnDirectDataGradientMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "needs the cpu backend";
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's direct convolution needs AVX2 and FMA, which this CPU lacks";
  ScopedPolicy always(cpu::set_own_direct_policy, cpu::KernelPolicy::always);
  struct Shape {
    int64_t N, C, H, W, O, K, pad, dilation;
    bool weight_channels_last;
  };
  const std::vector<Shape> shapes = {
      {2, 64, 8, 8, 64, 3, 1, 1, false},  {1, 150, 6, 5, 33, 3, 0, 1, true}, {2, 8, 11, 9, 20, 5, 2, 1, false},
      {1, 20, 9, 9, 24, 7, 3, 1, false},  {2, 16, 9, 9, 32, 3, 2, 2, true},  {1, 17, 7, 7, 40, 3, 2, 1, false},
  };
  uint64_t seed = 40;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(fmt::format("[{}, {}, {}, {}] * [{}, {}, {k}, {k}] pad {} dilation {}", s.N, s.C, s.H, s.W, s.O, s.C,
                             s.pad, s.dilation, fmt::arg("k", s.K)));
    const Tensor x0 = random_tensor({s.N, s.C, s.H, s.W}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    Tensor w = random_tensor({s.O, s.C, s.K, s.K}, ++seed, DType::f32, -0.1, 0.1);
    if (s.weight_channels_last) w = w.contiguous(MemoryFormat::channels_last);
    const Conv2dParams p{1, 1, s.pad, s.pad, s.dilation, s.dilation};
    const int64_t OH = s.H + 2 * s.pad - s.dilation * (s.K - 1), OW = s.W + 2 * s.pad - s.dilation * (s.K - 1);
    const Tensor r = random_tensor({s.N, s.O, OH, OW}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    auto dx = [&](Backend b, std::string* impl) {
      BackendGuard guard(DeviceType::cpu, b);
      const Tensor x = x0.detach().set_requires_grad(true);
      for (const OpEvent& e : profiled_events([&] { sum(mul(conv2d(x, w, Tensor(), p), r)).backward(); }))
        if (impl != nullptr && std::string(e.name) == "conv2d.backward_data") *impl = e.impl;
      return x.grad();
    };
    std::string impl;
    const Tensor got = dx(Backend::cpu, &impl), want = dx(Backend::reference, nullptr);
    EXPECT_NE(impl.find("duet:direct_nhwc_avx2 (dy by the flipped weights) [duet direct: DUET_OWN_DIRECT=always"),
              std::string::npos)
        << impl;
    EXPECT_TRUE(all_close(got, want, 1e-4, 1e-4));
  }
}

// The weight gradient on the direct kernel's register tile (dy^T times x's taps, the padding
// skipped), forced on, against the reference backend: 1x1 to 7x7 kernels, strides, every padding
// from 0 to d * (K - 1) and beyond the map, dilation, channel counts that leave a partial 6-channel
// or 16-channel tile, sums over several 256-pixel chunks (1x1, and 3x3 with partial tiles: 432
// pixels), a weight in NCHW (summed in a buffer and copied) and one channels-last (summed in place).
TEST(CpuBackend, OwnDirectWeightGradientMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "needs the cpu backend";
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's direct convolution needs AVX2 and FMA, which this CPU lacks";
  ScopedPolicy always(cpu::set_own_direct_policy, cpu::KernelPolicy::always);
  struct Shape {
    int64_t N, C, H, W, O, K, stride, pad, dilation;
    bool weight_channels_last;
  };
  const std::vector<Shape> shapes = {
      {2, 64, 8, 8, 64, 3, 1, 1, 1, false},  {1, 150, 6, 5, 33, 3, 1, 0, 1, true}, {2, 8, 11, 9, 20, 5, 2, 2, 1, false},
      {1, 20, 9, 9, 24, 7, 1, 3, 1, true},   {2, 16, 9, 9, 32, 3, 1, 2, 2, false}, {3, 17, 7, 7, 40, 3, 2, 1, 1, true},
      {9, 32, 12, 12, 13, 1, 1, 0, 1, false}, {4, 24, 3, 3, 16, 3, 1, 2, 1, false}, {3, 24, 12, 12, 20, 3, 1, 1, 1, true},
  };
  uint64_t seed = 70;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(fmt::format("[{}, {}, {}, {}] * [{}, {}, {k}, {k}] stride {} pad {} dilation {}", s.N, s.C, s.H, s.W,
                             s.O, s.C, s.stride, s.pad, s.dilation, fmt::arg("k", s.K)));
    const Tensor x = random_tensor({s.N, s.C, s.H, s.W}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    Tensor w0 = random_tensor({s.O, s.C, s.K, s.K}, ++seed, DType::f32, -0.1, 0.1);
    if (s.weight_channels_last) w0 = w0.contiguous(MemoryFormat::channels_last);
    const Conv2dParams p{s.stride, s.stride, s.pad, s.pad, s.dilation, s.dilation};
    const int64_t OH = (s.H + 2 * s.pad - s.dilation * (s.K - 1) - 1) / s.stride + 1;
    const int64_t OW = (s.W + 2 * s.pad - s.dilation * (s.K - 1) - 1) / s.stride + 1;
    const Tensor r = random_tensor({s.N, s.O, OH, OW}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    auto dw = [&](Backend b, std::string* impl) {
      BackendGuard guard(DeviceType::cpu, b);
      const Tensor w = w0.detach().set_requires_grad(true);
      for (const OpEvent& e : profiled_events([&] { sum(mul(conv2d(x, w, Tensor(), p), r)).backward(); }))
        if (impl != nullptr && std::string(e.name) == "conv2d.backward_weight") *impl = e.impl;
      return w.grad();
    };
    std::string impl;
    const Tensor got = dw(Backend::cpu, &impl), want = dw(Backend::reference, nullptr);
    EXPECT_NE(impl.find("duet:direct_nhwc_avx2 (dy^T by x's taps) [duet direct: DUET_OWN_DIRECT=always"),
              std::string::npos)
        << impl;
    if (s.K > 1) {  // 1x1: both
      EXPECT_EQ(got.is_contiguous(MemoryFormat::channels_last), s.weight_channels_last);
    }
    EXPECT_TRUE(all_close(got, want, 1e-4, 1e-4));
  }
}

// duet's Winograd F(4x4, 3x3) (backends/cpu/winograd_conv.h), forced on, against the reference
// backend in all three passes: padding 0, 1 and 2 (the data gradient's flipped forward pads 2, 1
// and 0), maps that fit the 4x4 tiles (8x8, 4x4) and maps that leave partial tiles or are smaller
// than one (7x5, 9x9, 3x3), a forward in two blocks of tiles and a weight gradient in three (each
// block's products added to those before), channel counts that leave a partial 8-channel vector on either side, a
// bias, a residual laid out as y (added in the output transform) or in NCHW (a pass after), relu
// inside and relu6 after, weights in NCHW (gradient stored through its strides) and channels-last.
TEST(CpuBackend, OwnWinogradMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "needs the cpu backend";
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's Winograd convolution needs AVX2 and FMA, which this CPU lacks";
  ScopedPolicy always(cpu::set_own_winograd_policy, cpu::KernelPolicy::always);
  // Weight gradients in blocks of 100 tiles (the default takes 1,024 or more).
  struct GradientBlocks {
    GradientBlocks() { cpu::set_own_winograd_gradient_block_tiles(100); }
    ~GradientBlocks() { cpu::set_own_winograd_gradient_block_tiles(0); }
  } gradient_blocks;
  enum Residual { none, like_y, nchw };
  struct Shape {
    int64_t N, C, H, W, O, pad;
    bool weight_channels_last;
    Residual residual;
    std::optional<Activation> act;
  };
  const std::vector<Shape> shapes = {
      {2, 64, 8, 8, 64, 1, false, none, Activation::relu},  {1, 13, 7, 5, 21, 1, true, like_y, Activation::relu},
      {3, 24, 9, 9, 16, 0, false, nchw, Activation::relu},  {1, 40, 6, 6, 9, 2, true, like_y, std::nullopt},
      {2, 8, 4, 4, 32, 1, false, none, Activation::relu6},  {1, 130, 3, 3, 70, 1, false, none, std::nullopt},
      // 256 tiles: the forward's blocks of 227 tiles (4 MiB of V and M at 64 + 64 channels) and a
      // last one of 29; the weight gradient's of 100, 100 and 56.
      {4, 64, 32, 30, 64, 1, false, like_y, Activation::relu},
  };
  uint64_t seed = 100;
  for (const Shape& s : shapes) {
    SCOPED_TRACE(fmt::format("[{}, {}, {}, {}] * [{}, {}, 3, 3] pad {}", s.N, s.C, s.H, s.W, s.O, s.C, s.pad));
    const int64_t OH = s.H + 2 * s.pad - 2, OW = s.W + 2 * s.pad - 2;
    const Tensor x0 = random_tensor({s.N, s.C, s.H, s.W}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    Tensor w0 = random_tensor({s.O, s.C, 3, 3}, ++seed, DType::f32, -0.1, 0.1);
    if (s.weight_channels_last) w0 = w0.contiguous(MemoryFormat::channels_last);
    const Tensor b = random_tensor({s.O}, ++seed, DType::f32);
    Tensor r;
    if (s.residual != none) r = random_tensor({s.N, s.O, OH, OW}, ++seed, DType::f32);
    if (s.residual == like_y) r = r.contiguous(MemoryFormat::channels_last);
    const Tensor dy = random_tensor({s.N, s.O, OH, OW}, ++seed, DType::f32).contiguous(MemoryFormat::channels_last);
    Conv2dParams p{1, 1, s.pad, s.pad, 1, 1};
    p.act = s.act;
    const Conv2dParams plain{1, 1, s.pad, s.pad, 1, 1};
    struct Result {
      Tensor y, dx, dw;
      std::map<std::string, std::string> impl;  // by event name
    };
    auto run = [&](Backend be) {
      BackendGuard guard(DeviceType::cpu, be);
      Result out;
      const Tensor x = x0.detach().set_requires_grad(true), w = w0.detach().set_requires_grad(true);
      for (const OpEvent& e : profiled_events([&] {
             {
               NoGradGuard no_grad;
               out.y = conv2d(x0, w0, b, p, r);
             }
             sum(mul(conv2d(x, w, Tensor(), plain), dy)).backward();
           }))
        out.impl[std::string(e.name).starts_with("conv2d.backward") ? e.name : std::string(e.name).substr(0, 6)] = e.impl;
      out.dx = x.grad();
      out.dw = w.grad();
      return out;
    };
    const Result got = run(Backend::cpu), want = run(Backend::reference);
    const std::string forced = "[duet winograd: DUET_OWN_WINOGRAD=always]";
    EXPECT_EQ(got.impl.at("conv2d"), "duet:winograd_f4x4_3x3_avx2 " + forced);
    EXPECT_EQ(got.impl.at("conv2d.backward_data"), "duet:winograd_f4x4_3x3_avx2 (dy by the flipped weights) " + forced);
    EXPECT_EQ(got.impl.at("conv2d.backward_weight"), "duet:winograd_f4x4_3x3_avx2 " + forced);
    EXPECT_TRUE(all_close(got.y, want.y, 1e-4, 1e-4));
    EXPECT_TRUE(all_close(got.dx, want.dx, 1e-4, 1e-4));
    EXPECT_TRUE(all_close(got.dw, want.dw, 1e-4, 1e-4));
    EXPECT_EQ(got.dw.is_contiguous(MemoryFormat::channels_last), s.weight_channels_last);
  }
}

// duet's Winograd forced on for every conv case, f32 and bf16: the three passes of the channels-last
// f32 3x3 stride-1 ones of one group take it (the weight gradient without a bias gradient), the
// others keep their kernels.
TEST(CpuBackend, OwnWinogradMatchesReferenceOnEveryConvCase) {
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's Winograd convolution needs AVX2 and FMA, which this CPU lacks";
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_own_winograd_policy, name_has("_nhwc")), 20);
}

// The direct kernel's relu keeps a NaN (as the reference's does, and unlike oneDNN's fused relu
// below AVX-512), and a frozen weight's packed panels are kept: the second forward repacks nothing
// and computes the unfrozen weight's bits.
TEST(CpuBackend, OwnDirectForwardKeepsNaNAndFrozenPanels) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "needs the cpu backend";
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's direct convolution needs AVX2 and FMA, which this CPU lacks";
  ScopedPolicy always(cpu::set_own_direct_policy, cpu::KernelPolicy::always);
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  NoGradGuard no_grad;
  const Tensor x = random_tensor({1, 24, 6, 6}, 1, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor w = random_tensor({40, 24, 3, 3}, 2, DType::f32);
  Conv2dParams p{1, 1, 1, 1};
  p.act = Activation::relu;
  const Tensor plain = conv2d(x, w, Tensor(), p);
  // Another frozen weight's forward first: keeping its copy drops the stale copies of earlier
  // tests, so that the count below moves by this test's copies only.
  const Tensor other = random_tensor({16, 24, 3, 3}, 3, DType::f32);
  other.freeze();
  conv2d(x, other, Tensor(), p);
  const size_t kept_before = frozen_copies_kept();
  w.freeze();
  const Tensor first = conv2d(x, w, Tensor(), p);
  EXPECT_EQ(frozen_copies_kept(), kept_before + 1) << "the frozen weight's packed panels are kept";
  const Tensor second = conv2d(x, w, Tensor(), p);
  EXPECT_EQ(frozen_copies_kept(), kept_before + 1) << "the second forward packs nothing";
  w.unfreeze();
  other.unfreeze();
  EXPECT_TRUE(all_close(first, plain, 0, 0));
  EXPECT_TRUE(all_close(second, plain, 0, 0));

  x.data<float>()[(2 * 6 + 3) * 24 + 5] = std::nanf("");  // pixel (2, 3), channel 5
  const Tensor y = conv2d(x, w, Tensor(), p);
  int nans = 0;
  for (int64_t i = 0; i < y.numel(); ++i) nans += std::isnan(y.data<float>()[i]);
  EXPECT_EQ(nans, 9 * 40) << "every output channel of the 3x3 pixels that see (2, 3)";
}

// Data gradients as the forward convolution of dy by the flipped weights (planner.h), forced on
// for every conv case, f32 and bf16: the stride-1 ones of one group take it (padded, dilated, any
// kernel, NCHW or channels-last), the others keep oneDNN's backward-data kernel.
TEST(CpuBackend, FlippedForwardDataGradientsMatchReference) {
  const auto stride_1_dense = [](const std::string& name) {
    return !name_has("stride")(name) && !name_has("depthwise")(name);
  };
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_flipped_data_gradient_policy, stride_1_dense), 20);
}

// Data gradients as dy W scattered back by col2im (planner.h), forced on for every conv case,
// f32 and bf16: every channels-last case of one group takes it, strided ones included.
TEST(CpuBackend, Col2imDataGradientsMatchReference) {
  const auto strided_nhwc = [](const std::string& name) { return name_has("stride")(name) && name_has("_nhwc")(name); };
  EXPECT_GE(forced_conv_cases_match_reference(cpu::set_col2im_data_gradient_policy, strided_nhwc), 4);
}

// Each forced algorithm really runs where it applies: the profile names it.
TEST(CpuBackend, ForcedDataGradientAlgorithmsRun) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x =
      random_tensor({2, 16, 8, 8}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  const Tensor w = random_tensor({24, 16, 3, 3}, 2, DType::f32);
  auto data_impl = [&](Conv2dParams p) {
    return profiled_impl("conv2d.backward_data", [&] { sum(conv2d(x, w, Tensor(), p)).backward(); });
  };
  {
    ScopedPolicy always(cpu::set_flipped_data_gradient_policy, cpu::KernelPolicy::always);
    const std::string impl = data_impl(Conv2dParams{1, 1, 1, 1});
    EXPECT_NE(impl.find("[flipped forward: DUET_FLIPPED_DGRAD=always]"), std::string::npos) << impl;
  }
  {
    ScopedPolicy always(cpu::set_col2im_data_gradient_policy, cpu::KernelPolicy::always);
    const std::string impl = data_impl(Conv2dParams{2, 2, 1, 1});
    EXPECT_EQ(impl.rfind("matmul/", 0), 0u) << impl;
    EXPECT_NE(impl.find("[col2im: DUET_COL2IM_DGRAD=always]"), std::string::npos) << impl;
  }
}

// The automatic policy's im2col weight gradients: bf16 3x3 layers onto maps of 16 pixels or fewer
// (ResNet's last stage at 32 px), strided or not; f32 ones, and bf16 ones computed in f32, onto maps
// of 64 pixels or fewer that Winograd does not take; not onto larger maps, not with a bias
// gradient. The im2col
// result equals oneDNN's kernel's within bf16 rounding.
TEST(CpuBackend, AutomaticPolicyRunsSmallMapWeightGradientsOnIm2col) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  auto run = [](const Shape& xs, const Shape& ws, int64_t stride, DType dt, bool bias) {
    const Tensor x = random_tensor(xs, 1, DType::f32).to(dt).contiguous(MemoryFormat::channels_last);
    const Tensor w = random_tensor(ws, 2, DType::f32).set_requires_grad(true);
    const Tensor b = bias ? random_tensor({ws[0]}, 3, DType::f32).set_requires_grad(true) : Tensor();
    profiler::clear();
    profiler::enable(true);
    Conv2dParams p{stride, stride, 1, 1};
    sum(conv2d(x, w.to(dt), bias ? b.to(dt) : Tensor(), p).to(DType::f32)).backward();
    profiler::enable(false);
    std::string impl;
    for (const OpEvent& e : profiler::collect())
      if (std::string(e.name) == "conv2d.backward_weight") impl = e.impl;
    profiler::clear();
    return std::make_pair(impl, w.grad());
  };
  // oneDNN's optimised matmul kernels, not its reference loops ("matmul/ref:any").
  const auto is_matmul = [](const std::string& impl) {
    return impl.rfind("matmul/", 0) == 0 && impl.find("ref") == std::string::npos;
  };
  // f32 first: bf16 convolutions run on the reference loops below AVX-512.
  // Winograd's with AVX-512; below it duet's Winograd takes this stride-1 layer (64 tiles), im2col
  // where the CPU lacks AVX2 as well.
  const std::string small_f32 = run({64, 64, 4, 4}, {96, 64, 3, 3}, 1, DType::f32, false).first;
  if (cpu::cpu_caps().avx512)
    EXPECT_FALSE(is_matmul(small_f32)) << small_f32;
  else if (cpu::cpu_caps().avx2)
    EXPECT_NE(small_f32.find("duet:winograd_f4x4_3x3_avx2 [duet winograd: 3x3 stride 1 below AVX-512, 64->96 channels"),
              std::string::npos)
        << small_f32;
  else
    EXPECT_TRUE(is_matmul(small_f32)) << small_f32;
  const auto [strided_f32, g_strided_f32] = run({8, 32, 16, 16}, {64, 32, 3, 3}, 2, DType::f32, false);  // onto 8x8
  EXPECT_TRUE(is_matmul(strided_f32)) << strided_f32;
  EXPECT_FALSE(is_matmul(run({8, 32, 32, 32}, {64, 32, 3, 3}, 2, DType::f32, false).first));  // onto 16x16
  const Tensor g_strided_direct = [&] {
    ScopedPolicy never(cpu::set_im2col_weight_gradient_policy, cpu::KernelPolicy::never);
    return run({8, 32, 16, 16}, {64, 32, 3, 3}, 2, DType::f32, false).second;
  }();
  EXPECT_TRUE(all_close(g_strided_f32, g_strided_direct, 1e-4, 1e-4));  // sums of 512 f32 products
  DUET_SKIP_WITHOUT_ONEDNN_BF16("a bf16 weight gradient off the reference loops");
  const auto [small, g_small] = run({8, 64, 4, 4}, {96, 64, 3, 3}, 1, DType::bf16, false);
  EXPECT_TRUE(is_matmul(small)) << small;
  const std::string strided = run({8, 32, 8, 8}, {64, 32, 3, 3}, 2, DType::bf16, false).first;
  EXPECT_TRUE(is_matmul(strided)) << strided;
  // Onto 8x8, im2col only where bf16 runs on AMX (its rule goes to 64 pixels there) or computes in
  // f32 (bf16_speed.h: f32's rule, 64 pixels, takes it); onto 16x16 not.
  EXPECT_EQ(is_matmul(run({8, 64, 8, 8}, {96, 64, 3, 3}, 1, DType::bf16, false).first),
            cpu::bf16_on_amx() || cpu::bf16_math_in_f32());
  EXPECT_FALSE(is_matmul(run({8, 64, 16, 16}, {96, 64, 3, 3}, 1, DType::bf16, false).first));
  EXPECT_FALSE(is_matmul(run({8, 64, 4, 4}, {96, 64, 3, 3}, 1, DType::bf16, true).first));
  ScopedPolicy never(cpu::set_im2col_weight_gradient_policy, cpu::KernelPolicy::never);
  const auto [onednn, g_onednn] = run({8, 64, 4, 4}, {96, 64, 3, 3}, 1, DType::bf16, false);
  EXPECT_FALSE(is_matmul(onednn)) << onednn;
  // Sums of 128 bf16 products of values in [-1, 1): each gradient rounded to bf16 once.
  EXPECT_TRUE(all_close(g_small, g_onednn, 0.05, 1e-2));
}

// Below AVX-512 (planner.cpp, dense_kernel_without_avx512) a 3x3 layer of 128 channels runs its
// weight gradient on duet's direct kernel (as im2col where the CPU lacks AVX2) and its data
// gradient as col2im; 32 channels keep oneDNN's direct
// kernel for the data gradient. The forwards onto maps of at most 16x16 run duet's direct kernel
// (where the CPU has AVX2), strided or not; a larger map with more than 4,096 output pixels runs
// oneDNN's blocked kernel. With AVX-512 none of these reasons appears. Each result matches the
// reference backend. duet's Winograd, which takes the stride-1 layers first where the CPU has AVX2
// (the next test), is off here: these are the rules for its layers when DUET_OWN_WINOGRAD=0.
TEST(CpuBackend, AutomaticPolicyWithoutAvx512RunsDenseLayersOnSgemm) {
  ScopedPolicy no_winograd(cpu::set_own_winograd_policy, cpu::KernelPolicy::never);
  const bool avx2 = !cpu::cpu_caps().avx512, own = avx2 && cpu::cpu_caps().avx2;
  // The gradients of sum(y^2) on backend b, and on the cpu backend each conv pass's implementation.
  auto grads = [](Backend b, int64_t N, int64_t C, int64_t H, int64_t stride, std::map<std::string, std::string>& impls) {
    BackendGuard guard(DeviceType::cpu, b);
    const Tensor x = random_tensor({N, C, H, H}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
    const Tensor w = random_tensor({C, C, 3, 3}, 2, DType::f32, -0.1, 0.1).set_requires_grad(true);
    profiler::clear();
    profiler::enable(true);
    const Tensor y = conv2d(x, w, Tensor(), Conv2dParams{stride, stride, 1, 1});
    sum(mul(y, y)).backward();
    profiler::enable(false);
    for (const OpEvent& e : profiler::collect())
      if (std::string(e.name).rfind("conv2d", 0) == 0) impls[e.name] = e.impl;
    profiler::clear();
    return std::make_pair(x.grad(), w.grad());
  };
  auto impls = [&](int64_t N, int64_t C, int64_t H, int64_t stride) {
    std::map<std::string, std::string> cpu, unused;
    const auto [dx, dw] = grads(Backend::cpu, N, C, H, stride, cpu);
    const auto [dx_ref, dw_ref] = grads(Backend::reference, N, C, H, stride, unused);
    EXPECT_TRUE(all_close(dx, dx_ref, 1e-3, 1e-3)) << C << " channels, stride " << stride;
    EXPECT_TRUE(all_close(dw, dw_ref, 1e-2, 1e-3)) << C << " channels, stride " << stride;
    return cpu;
  };
  const auto has = [](const std::string& impl, const char* reason) { return impl.find(reason) != std::string::npos; };
  auto wide = impls(4, 128, 16, 1);
  EXPECT_EQ(has(wide["conv2d.backward_weight"], "[im2col: weight gradient without AVX-512, 128->128 channels >= 64]"),
            avx2 && !own)
      << wide["conv2d.backward_weight"];
  EXPECT_EQ(has(wide["conv2d.backward_weight"],
                "duet:direct_nhwc_avx2 (dy^T by x's taps) [duet direct: 3x3 weight gradient below AVX-512, 128->128 channels >= 64]"),
            own)
      << wide["conv2d.backward_weight"];
  EXPECT_EQ(has(wide["conv2d.backward_data"], "[col2im: data gradient without AVX-512, 128->128 channels >= 128]"), avx2)
      << wide["conv2d.backward_data"];
  EXPECT_EQ(has(wide["conv2d"], "duet:direct_nhwc_avx2 [duet direct: 3x3 kernel below AVX-512, output 16x16 of <= 256 pixels]"),
            own)
      << wide["conv2d"];
  auto strided = impls(4, 128, 16, 2);
  EXPECT_EQ(has(strided["conv2d"], "[duet direct: 3x3 kernel below AVX-512, output 8x8 of <= 256 pixels]"), own)
      << strided["conv2d"];
  auto narrow = impls(4, 32, 16, 1);
  EXPECT_FALSE(has(narrow["conv2d.backward_data"], "without AVX-512")) << narrow["conv2d.backward_data"];
  EXPECT_EQ(has(narrow["conv2d"], "[duet direct: 3x3 kernel below AVX-512, output 16x16 of <= 256 pixels]"), own)
      << narrow["conv2d"];
  auto large = impls(5, 64, 32, 1);
  EXPECT_EQ(has(large["conv2d"], "[blocked layout: 3x3 kernel without AVX-512, 64->64 channels >= 64]"), avx2)
      << large["conv2d"];
  auto few_images = impls(2, 64, 32, 1);
  EXPECT_EQ(has(few_images["conv2d"], "[duet direct: 3x3 kernel below AVX-512, 2048 output pixels <= 4096]"), own)
      << few_images["conv2d"];
}

// The implementations the profiler records for f's ops on the cpu backend, joined.
std::string impls_of(const std::function<Tensor()>& f) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  std::string impl;
  for (const OpEvent& e : profiled_events([&] { f(); })) impl += e.impl;
  return impl;
}

// Below AVX-512 with AVX2 (planner.cpp's own_winograd_rule) duet's Winograd takes all three passes
// of 3x3 stride-1 layers of 32 channels or more on both sides, onto maps of 4x4 or more, with at
// least 4 tiles and products of at least 2^21 multiply-adds; not the strided layers, not 16
// channels, not a 2x2 map, not a single tile (one image of a 4x4 map), not small products (16
// tiles of 64->32: 1.2 million), and not a weight gradient with a bias gradient. With AVX-512 it
// takes only forwards over 32 to 255 tiles, frozen weights or not (a frozen weight's result has
// the unfrozen bits); without AVX2, nothing. Each result matches the reference backend.
TEST(CpuBackend, AutomaticPolicyRunsStride1LayersOnOwnWinograd) {
  const bool own = !cpu::cpu_caps().avx512 && cpu::cpu_caps().avx2;
  const bool own_forward_64_tiles = cpu::cpu_caps().avx2;  // below AVX-512, or with it over 32-255 tiles
  auto impls = [](int64_t N, int64_t C, int64_t O, int64_t H, int64_t stride, bool bias) {
    std::map<std::string, std::string> by_pass;
    Tensor grads[2][3];
    for (Backend b : {Backend::cpu, Backend::reference}) {
      BackendGuard guard(DeviceType::cpu, b);
      const Tensor x =
          random_tensor({N, C, H, H}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
      const Tensor w = random_tensor({O, C, 3, 3}, 2, DType::f32, -0.1, 0.1).set_requires_grad(true);
      const Tensor bv = bias ? random_tensor({O}, 3, DType::f32).set_requires_grad(true) : Tensor();
      for (const OpEvent& e : profiled_events([&] {
             const Tensor y = conv2d(x, w, bv, Conv2dParams{stride, stride, 1, 1});
             sum(mul(y, y)).backward();
           }))
        if (b == Backend::cpu && std::string(e.name).rfind("conv2d", 0) == 0) by_pass[e.name] = e.impl;
      Tensor* g = grads[b == Backend::cpu ? 0 : 1];
      g[0] = x.grad();
      g[1] = w.grad();
      g[2] = bias ? bv.grad() : Tensor();
    }
    EXPECT_TRUE(all_close(grads[0][0], grads[1][0], 1e-3, 1e-3)) << C << "->" << O << " at " << H << "x" << H;
    EXPECT_TRUE(all_close(grads[0][1], grads[1][1], 1e-2, 1e-3)) << C << "->" << O << " at " << H << "x" << H;
    return by_pass;
  };
  const auto winograd = [](const std::string& impl) { return impl.find("[duet winograd: ") != std::string::npos; };
  auto wide = impls(4, 128, 64, 16, 1, false);  // 64 tiles
  EXPECT_EQ(winograd(wide["conv2d"]), own_forward_64_tiles) << wide["conv2d"];
  for (const char* pass : {"conv2d.backward_data", "conv2d.backward_weight"})
    EXPECT_EQ(winograd(wide[pass]), own) << pass << ": " << wide[pass];
  EXPECT_EQ(wide["conv2d"].find("duet:winograd_f4x4_3x3_avx2 [duet winograd: 3x3 stride 1 below AVX-512, 128->64 "
                                "channels >= 32, 64 tiles of 4x4 onto 16x16]") != std::string::npos,
            own)
      << wide["conv2d"];
  auto one_tile = impls(1, 128, 128, 4, 1, false);
  auto four_tiles = impls(4, 128, 128, 4, 1, false);  // 2.4 million multiply-adds
  EXPECT_FALSE(winograd(one_tile["conv2d"])) << one_tile["conv2d"];
  EXPECT_EQ(winograd(four_tiles["conv2d"]), own) << four_tiles["conv2d"];
  for (const auto& [N, C, O, H, stride] : {std::tuple{4, 64, 64, 16, 2}, std::tuple{4, 16, 64, 16, 1},
                                           std::tuple{4, 64, 16, 16, 1}, std::tuple{16, 64, 64, 2, 1},
                                           std::tuple{4, 64, 32, 8, 1}}) {
    auto no = impls(N, C, O, H, stride, false);
    for (const auto& [pass, impl] : no) EXPECT_FALSE(winograd(impl)) << C << "->" << O << " at " << H << ", " << pass;
  }
  auto with_bias = impls(4, 64, 64, 8, 1, true);
  EXPECT_EQ(winograd(with_bias["conv2d"]), own) << with_bias["conv2d"];
  EXPECT_FALSE(winograd(with_bias["conv2d.backward_weight"])) << with_bias["conv2d.backward_weight"];
  // Frozen weights (inference: the transformed kernels kept), with the unfrozen bits: 64->64 for 4
  // images of 16x16 (64 tiles) and 16 images (256 tiles); 256->256 for one image of 8x8 (4 tiles,
  // 9.4 million multiply-adds).
  for (const auto& [N, C, H] : {std::tuple{4, 64, 16}, std::tuple{16, 64, 16}, std::tuple{1, 256, 8}}) {
    const Tensor x = random_tensor({N, C, H, H}, 4, DType::f32).contiguous(MemoryFormat::channels_last);
    const Tensor w = random_tensor({C, C, 3, 3}, 5, DType::f32, -0.1, 0.1);
    const auto f = [&] { return conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1}); };
    Tensor want;
    {
      BackendGuard guard(DeviceType::cpu, Backend::reference);
      want = f();
    }
    Tensor plain, got;
    {
      BackendGuard guard(DeviceType::cpu, Backend::cpu);
      plain = f();
    }
    w.freeze();
    const std::string impl = impls_of(f);
    {
      BackendGuard guard(DeviceType::cpu, Backend::cpu);
      got = f();
    }
    w.unfreeze();
    const bool avx512_takes = N == 4 && C == 64;
    EXPECT_EQ(winograd(impl), cpu::cpu_caps().avx2 && (avx512_takes || !cpu::cpu_caps().avx512))
        << N << " images of " << C << " channels: " << impl;
    EXPECT_TRUE(all_close(got, want, 1e-3, 1e-3)) << N << " images of " << C << " channels";
    EXPECT_TRUE(all_close(got, plain, 0, 0)) << N << " images of " << C << " channels: frozen against unfrozen";
  }
}

// The automatic policy gives duet's depthwise kernel the forwards of one thread's work (fewer
// multiply-adds than the threads' grain: planner.cpp's depthwise_rule), as MobileNetV2's last
// stages for one image at 32 px, and leaves larger ones to oneDNN's depthwise kernels. The forward
// applies relu6 in its store with the bits of a separate pass, and a frozen weight (its taps kept)
// gives the unfrozen weight's bits.
TEST(CpuBackend, AutomaticPolicyRunsSmallDepthwiseForwardsOnOwnKernel) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const auto own = [](const std::string& impl) { return impl.find("[duet depthwise: a forward of") != std::string::npos; };
  for (const auto& [N, C, H] : {std::tuple{1, 960, 1}, std::tuple{1, 384, 2}, std::tuple{1, 192, 4},
                                std::tuple{1, 96, 16}, std::tuple{8, 144, 8}}) {
    SCOPED_TRACE(fmt::format("{} images of {} x {} x {}", N, C, H, H));
    const Tensor x = random_tensor({N, C, H, H}, 1, DType::f32).contiguous(MemoryFormat::channels_last);
    const Tensor w = random_tensor({C, 1, 3, 3}, 2, DType::f32, -0.5, 0.5);
    const Tensor b = random_tensor({C}, 3, DType::f32);
    Conv2dParams p{1, 1, 1, 1};
    p.groups = C;
    const Tensor plain = relu6(conv2d(x, w, b, p));
    p.act = Activation::relu6;
    const auto f = [&] { return conv2d(x, w, b, p); };
    const std::string impl = impls_of(f);
    EXPECT_EQ(own(impl), N * C * H * H * 9 < cpu::kParallelGrain) << impl;
    EXPECT_TRUE(all_close(f(), plain, 0, 0)) << "relu6 in the store against a pass: " << impl;
    w.freeze();
    b.freeze();
    const Tensor frozen = f();
    EXPECT_EQ(impls_of(f), impl);
    w.unfreeze();
    b.unfreeze();
    EXPECT_TRUE(all_close(frozen, plain, 0, 0)) << "frozen against unfrozen: " << impl;
  }
}

// The weight gradient of a pointwise convolution over many pixel rows sums them in one chunk per
// thread, as one batched product (backends/cpu/conv.cpp). With 2 and 3 threads, more and fewer
// output than input channels, f32 and bf16, and a row count no thread count divides (one
// product then), it matches the reference backend, on oneDNN's optimised matmul kernels (its
// reference loops, "ref:any", would also match, at a thousandth of the speed).
TEST(CpuBackend, PointwiseWeightGradientSummedInChunksMatchesReference) {
  ScopedPolicy always(cpu::set_pointwise_gemm_policy, cpu::KernelPolicy::always);
  const int before = num_threads();
  struct Restore {
    int n;
    ~Restore() { set_num_threads(n); }
  } restore{before};
  struct Shapes {
    int64_t n, c, o, h;
  };
  int chunked = 0;
  for (const Shapes sh : {Shapes{6, 48, 80, 32}, Shapes{6, 80, 48, 32}, Shapes{7, 48, 40, 17}})
    for (const int threads : {2, 3})
      for (const DType dt : {DType::f32, DType::bf16}) {
        if (dt == DType::bf16 && !cpu::cpu_caps().avx512) continue;  // the reference loops below AVX-512
        SCOPED_TRACE(fmt::format("x [{}, {}, {}, {}], {} outputs, {} threads, {}", sh.n, sh.c, sh.h, sh.h, sh.o,
                                 threads, dtype_name(dt)));
        set_num_threads(threads);
        const Tensor x0 = random_tensor({sh.n, sh.c, sh.h, sh.h}, 1, DType::f32).to(dt);
        const Tensor w0 = random_tensor({sh.o, sh.c, 1, 1}, 2, DType::f32);
        const Tensor g = random_tensor({sh.n, sh.o, sh.h, sh.h}, 3, DType::f32).to(dt);
        auto weight_grad = [&](Backend b) {
          BackendGuard guard(DeviceType::cpu, b);
          const Tensor x = x0.contiguous(MemoryFormat::channels_last);
          const Tensor w = w0.clone().set_requires_grad(true);
          profiler::clear();
          profiler::enable(true);
          // (A bf16 weight is an f32 leaf cast, as autocast casts it.)
          sum(mul(conv2d(x, w.to(dt), Tensor(), Conv2dParams{}), g.contiguous(MemoryFormat::channels_last))).backward();
          profiler::enable(false);
          std::string impl;
          for (const OpEvent& e : profiler::collect())
            if (std::string(e.name) == "conv2d.backward_weight") impl = e.impl;
          profiler::clear();
          return std::make_pair(w.grad(), impl);
        };
        const auto [cpu, impl] = weight_grad(Backend::cpu);
        const auto [ref, unused] = weight_grad(Backend::reference);
        EXPECT_EQ(impl.rfind("matmul/", 0), 0u) << impl;
        EXPECT_EQ(impl.find("ref"), std::string::npos) << impl;
        // Sums of 6,000 products of values in [-1, 1): f32 rounding, or bf16's of the result.
        EXPECT_TRUE(dt == DType::f32 ? all_close(cpu, ref, 1e-3, 1e-4) : all_close(cpu, ref, 0.5, 1e-2));
        chunked += (sh.n * sh.h * sh.h) % threads == 0;
      }
  EXPECT_EQ(chunked, cpu::cpu_caps().avx512 ? 8 : 4);
}

// Which pointwise convolutions the automatic policy gives to matmul: all three passes of a
// DenseNet bottleneck on a 2x2 map; none of a small batch's on a 32x32 map; the weight pass only
// of ResNet-50's 32x32 layer at batch 32; not a 1x1 with a bias gradient's weight pass.
TEST(CpuBackend, AutomaticPolicyRunsSmallPointwiseConvolutionsAsMatmul) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  auto impls = [](const Shape& xs, const Shape& ws, bool bias, DType dt = DType::f32) {
    const Tensor x = random_tensor(xs, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
    const Tensor w = random_tensor(ws, 2, DType::f32).set_requires_grad(true);
    const Tensor b = bias ? random_tensor({ws[0]}, 3, DType::f32).set_requires_grad(true) : Tensor();
    profiler::clear();
    profiler::enable(true);
    sum(conv2d(x.to(dt), w.to(dt), bias ? b.to(dt) : b, Conv2dParams{}).to(DType::f32)).backward();  // stride 1, no padding
    profiler::enable(false);
    std::string all;
    for (const OpEvent& e : profiler::collect())
      if (std::string(e.name).rfind("conv2d", 0) == 0) all += std::string(e.name) + "=" + e.impl + " ";
    profiler::clear();
    return all;
  };
  // Passes run as matrix products: on oneDNN's matmul, or (small forwards below AVX-512) on duet's
  // direct kernel as one (direct_conv.h).
  const auto count = [](const std::string& s) {
    size_t n = 0;
    for (const char* product : {"matmul/", "(matrix product as 1x1)"})
      for (size_t at = s.find(product); at != std::string::npos; at = s.find(product, at + 1)) ++n;
    return n;
  };
  const std::string dense = impls({64, 512, 2, 2}, {128, 512, 1, 1}, false);
  EXPECT_EQ(count(dense), 3u) << dense;
  const std::string resnet = impls({4, 64, 32, 32}, {64, 64, 1, 1}, false);
  EXPECT_EQ(count(resnet), 0u) << resnet;
  // 32,768 pixel rows: the backward passes go to matmul (the weight gradient's long sum, the data
  // gradient's product), the forward does not.
  const std::string long_sum = impls({32, 64, 32, 32}, {128, 64, 1, 1}, false);
  EXPECT_EQ(count(long_sum), 2u) << long_sum;
  EXPECT_NE(long_sum.find("conv2d.backward_weight=matmul/"), std::string::npos) << long_sum;
  EXPECT_NE(long_sum.find("conv2d.backward_data=matmul/"), std::string::npos) << long_sum;
  const std::string biased = impls({8, 32, 2, 2}, {16, 32, 1, 1}, true);
  EXPECT_EQ(count(biased), 2u) << biased;  // forward and backward data
  ScopedPolicy never(cpu::set_pointwise_gemm_policy, cpu::KernelPolicy::never);
  const std::string off = impls({64, 512, 2, 2}, {128, 512, 1, 1}, false);
  EXPECT_EQ(count(off), 0u) << off;
  // bf16 weight gradients from 4,096 rows where bf16 has no AMX (the 1x1 bf16 kernel sums them
  // slower); not in f32, and the other passes not. On AMX all three passes of a layer with at most
  // 256 inputs (oneDNN's AMX matmul beat its AMX 1x1 kernels there).
  DUET_SKIP_WITHOUT_ONEDNN_BF16("a bf16 convolution off the reference loops");
  ScopedPolicy automatic(cpu::set_pointwise_gemm_policy, cpu::KernelPolicy::automatic);
  const std::string bf16 = impls({4, 64, 32, 32}, {64, 64, 1, 1}, false, DType::bf16);
  EXPECT_EQ(count(bf16), cpu::bf16_on_amx() ? 3u : 1u) << bf16;
  EXPECT_NE(bf16.find("conv2d.backward_weight=matmul/"), std::string::npos) << bf16;
  EXPECT_EQ(count(impls({2, 64, 32, 32}, {64, 64, 1, 1}, false, DType::bf16)), cpu::bf16_on_amx() ? 3u : 0u);
  if (cpu::bf16_on_amx()) {  // a forward of 512 inputs stays on the convolution kernel
    EXPECT_EQ(count(impls({2, 512, 8, 8}, {64, 512, 1, 1}, false, DType::bf16)), 2u);
  }
}

// The machine-aware rules of bf16 on AMX (planner.cpp): each layer's data and weight gradient as
// the profile names it, with the rule's reason; on a CPU without AMX none of them fires.
TEST(CpuBackend, Bf16OnAmxRulesPickTheirAlgorithmPerLayer) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  auto impls = [](const Shape& xs, const Shape& ws, int64_t stride, int64_t pad) {
    const Tensor x = random_tensor(xs, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
    const Tensor w = random_tensor(ws, 2, DType::f32).set_requires_grad(true);
    profiler::clear();
    profiler::enable(true);
    sum(conv2d(x.to(DType::bf16), w.to(DType::bf16), Tensor(), Conv2dParams{stride, stride, pad, pad}).to(DType::f32))
        .backward();
    profiler::enable(false);
    std::map<std::string, std::string> by_pass;
    for (const OpEvent& e : profiler::collect()) by_pass[e.name] = e.impl;
    profiler::clear();
    return by_pass;
  };
  const bool amx = cpu::bf16_on_amx();
  auto has = [](const std::string& impl, const char* what) { return impl.find(what) != std::string::npos; };
  auto deep = impls({4, 512, 4, 4}, {512, 512, 3, 3}, 1, 1);  // ResNet's last stage at 32 px
  // Its forward: im2col's 64 rows on the AMX matmul; one image's 16 rows stay on brgconv.
  EXPECT_EQ(has(deep["conv2d"], "[im2col: bf16 forward on AMX onto 4x4 <= 16 pixels, 64 rows >= 32]"), amx)
      << deep["conv2d"];
  auto one_image = impls({1, 512, 4, 4}, {512, 512, 3, 3}, 1, 1);
  EXPECT_FALSE(has(one_image["conv2d"], "im2col")) << one_image["conv2d"];
  EXPECT_EQ(has(deep["conv2d.backward_data"], "[col2im: bf16 data gradient on AMX"), amx) << deep["conv2d.backward_data"];
  EXPECT_EQ(has(deep["conv2d.backward_weight"], "[im2col: bf16 weight gradient on AMX"), amx)
      << deep["conv2d.backward_weight"];
  auto mid = impls({4, 64, 16, 16}, {64, 64, 3, 3}, 1, 1);
  EXPECT_EQ(has(mid["conv2d.backward_data"], "[flipped forward: bf16 data gradient on AMX"), amx)
      << mid["conv2d.backward_data"];
  EXPECT_FALSE(has(mid["conv2d.backward_weight"], "im2col")) << mid["conv2d.backward_weight"];
  auto shortcut = impls({4, 64, 16, 16}, {128, 64, 1, 1}, 2, 0);  // a strided 1x1 projection onto 8x8
  EXPECT_EQ(has(shortcut["conv2d.backward_data"], "[col2im: bf16 strided"), amx) << shortcut["conv2d.backward_data"];
  auto pointwise = impls({4, 256, 8, 8}, {64, 256, 1, 1}, 1, 0);
  EXPECT_EQ(has(pointwise["conv2d.backward_weight"], "[matrix product: bf16 pointwise weight gradient on AMX"), amx)
      << pointwise["conv2d.backward_weight"];
  EXPECT_EQ(has(pointwise["conv2d"], "[matrix product: bf16 pointwise forward on AMX"), amx) << pointwise["conv2d"];
  // A wide pointwise forward: the matrix product onto a 4x4 map, the convolution kernel onto 8x8.
  auto wide_small = impls({4, 512, 4, 4}, {128, 512, 1, 1}, 1, 0);
  EXPECT_EQ(has(wide_small["conv2d"], "[matrix product: bf16 pointwise forward on AMX onto 4x4 <= 16 pixels]"), amx)
      << wide_small["conv2d"];
  auto wide = impls({4, 512, 8, 8}, {128, 512, 1, 1}, 1, 0);
  EXPECT_FALSE(has(wide["conv2d"], "matrix product")) << wide["conv2d"];
}

// The speed of bf16 dot products against f32 FMAs (bf16_speed.h) is measured, and where it is low
// (Intel Xeon without AMX: about 0.5) bf16 convolutions compute in f32 and the f32 rules plan them:
// 3x3 stride-1 layers from 32 channels onto 4x4 maps run on Winograd in all three passes. Where it
// is high (AMD Zen 4 and 5: about 2) bf16 layers compute in bf16 and such a layer stays off
// Winograd (bf16 takes it from 256 channels onto 8x8), its weight gradient on im2col.
TEST(CpuBackend, Bf16DotSpeedDecidesWhetherBf16LayersComputeInF32) {
  const double dots = cpu::bf16_dot_speedup();
  if (!cpu::cpu_caps().avx512_bf16) {
    EXPECT_EQ(dots, 0.0);
  } else {
    EXPECT_GT(dots, 0.2);  // 0.5 on Intel Xeon family 6 model 207; a broken timing reads 0 or absurd
    EXPECT_LT(dots, 4.0);
  }
  DUET_SKIP_WITHOUT_ONEDNN_BF16("a bf16 convolution off the reference loops");
  const bool slow = !cpu::bf16_on_amx() && dots < cpu::kBf16FastDots;
  EXPECT_EQ(cpu::bf16_math_in_f32(), slow);
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  auto impls = [](const Shape& xs, const Shape& ws) {
    const Tensor x = random_tensor(xs, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
    const Tensor w = random_tensor(ws, 2, DType::f32).set_requires_grad(true);
    const int64_t pad = ws[2] / 2;
    profiler::clear();
    profiler::enable(true);
    sum(conv2d(x.to(DType::bf16), w.to(DType::bf16), Tensor(), Conv2dParams{1, 1, pad, pad}).to(DType::f32)).backward();
    profiler::enable(false);
    std::map<std::string, std::string> by_pass;
    for (const OpEvent& e : profiler::collect()) by_pass[e.name] = e.impl;
    profiler::clear();
    return by_pass;
  };
  const bool fast = !cpu::bf16_on_amx() && !slow;
  const auto has = [](const std::string& impl, const char* part) { return impl.find(part) != std::string::npos; };
  // 64 channels onto 4x4 maps of 64 images: 1,024 output pixels, a Winograd layer in f32.
  auto small = impls({64, 64, 4, 4}, {64, 64, 3, 3});
  // A pointwise layer of 256 channels (204 FLOPs an element): the f32 kernels where bf16 computes in
  // f32 (their names then lack bf16); one of 64 (60 FLOPs an element) stays bf16 everywhere.
  auto pointwise = impls({8, 256, 8, 8}, {256, 256, 1, 1});
  auto thin = impls({8, 64, 8, 8}, {64, 64, 1, 1});
  for (const char* pass : {"conv2d", "conv2d.backward_data", "conv2d.backward_weight"}) {
    EXPECT_EQ(has(small[pass], "[winograd: 3x3 stride 1"), slow) << pass << ": " << small[pass];
    EXPECT_EQ(has(small[pass], "; bf16 in f32: 450 FLOPs an element >= 128, bf16 dots"), slow) << pass << ": " << small[pass];
    EXPECT_EQ(has(pointwise[pass], "bf16 in f32"), slow) << pass << ": " << pointwise[pass];
    EXPECT_EQ(has(pointwise[pass], "_bf16"), !slow) << pass << ": " << pointwise[pass];
    EXPECT_FALSE(has(thin[pass], "bf16 in f32")) << pass << ": " << thin[pass];
  }
  EXPECT_EQ(has(small["conv2d.backward_weight"], "[im2col: bf16 weight gradient onto"), fast)
      << small["conv2d.backward_weight"];
  // Forced either way on any CPU oneDNN computes bf16 on; a depthwise layer keeps bf16 regardless.
  {
    ScopedPolicy always(cpu::set_bf16_math_in_f32_policy, cpu::KernelPolicy::always);
    auto forced = impls({8, 64, 8, 8}, {64, 64, 1, 1});
    EXPECT_TRUE(has(forced["conv2d"], "bf16 in f32: DUET_BF16_MATH_IN_F32=always")) << forced["conv2d"];
    EXPECT_FALSE(has(forced["conv2d"], "_bf16")) << forced["conv2d"];
  }
  {
    ScopedPolicy never(cpu::set_bf16_math_in_f32_policy, cpu::KernelPolicy::never);
    EXPECT_FALSE(cpu::bf16_math_in_f32());
    auto kept = impls({8, 64, 8, 8}, {64, 64, 1, 1});
    EXPECT_FALSE(has(kept["conv2d"], "bf16 in f32")) << kept["conv2d"];
  }
  const Tensor map = Tensor::empty({8, 64, 8, 8});
  EXPECT_FALSE(cpu::bf16_conv_in_f32(map, Tensor::empty({64, 1, 3, 3}), map, 64));
}

// bf16 arithmetic in f32 (bf16_speed.h) forced on, and forced off, on any CPU where oneDNN computes
// bf16: every bf16 case (convolutions, linear layers, matrix products, the composite networks)
// matches the reference within bf16's tolerance, and so does every convolution case with the
// matrix-product algorithms forced, whose operands the product converts (backends/cpu/matmul.cpp).
TEST(CpuBackend, Bf16MathInF32MatchesReference) {
  DUET_SKIP_WITHOUT_ONEDNN_BF16("bf16 convolutions and products on oneDNN");
  for (const cpu::KernelPolicy math : {cpu::KernelPolicy::always, cpu::KernelPolicy::never}) {
    ScopedPolicy forced(cpu::set_bf16_math_in_f32_policy, math);
    SCOPED_TRACE(cpu::policy_name(math));
    EXPECT_EQ(cpu::bf16_math_in_f32(), math == cpu::KernelPolicy::always);
    int n = 0;
    for (const Case& c : opcheck::bf16_cases()) {
      SCOPED_TRACE(c.name);
      expect_cpu_matches_reference(c);
      ++n;
    }
    EXPECT_GE(n, 50);
    EXPECT_GE(forced_conv_cases_match_reference(cpu::set_pointwise_gemm_policy, name_has("1x1")), 20);
    EXPECT_GE(forced_conv_cases_match_reference(cpu::set_im2col_forward_policy, name_has("_nhwc")), 20);
    EXPECT_GE(forced_conv_cases_match_reference(cpu::set_col2im_data_gradient_policy, name_has("_nhwc")), 20);
  }
}

// Frozen bf16 weights where bf16 computes in f32: the matrix product converts them once per freeze
// and keeps the f32 copy (packed in turn), the convolution's reorder keeps its f32 blocked copy;
// either way the results are the unfrozen weights' bits, and a new freeze of changed weights is
// never served the old copy.
TEST(CpuBackend, FrozenBf16WeightsComputedInF32KeepTheUnfrozenBits) {
  DUET_SKIP_WITHOUT_ONEDNN_BF16("bf16 products on oneDNN");
  ScopedPolicy always(cpu::set_bf16_math_in_f32_policy, cpu::KernelPolicy::always);
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  NoGradGuard no_grad;
  const Tensor x = random_tensor({16, 64, 8, 8}, 1, DType::f32).contiguous(MemoryFormat::channels_last).to(DType::bf16);
  const Tensor rows = random_tensor({32, 64}, 2, DType::f32).to(DType::bf16);
  for (const Shape& ws : {Shape{48, 64, 1, 1}, Shape{48, 64, 3, 3}}) {
    const Tensor w = random_tensor(ws, 3, DType::f32).to(DType::bf16);
    const int64_t pad = ws[2] / 2;
    const auto conv = [&] { return conv2d(x, w, Tensor(), Conv2dParams{1, 1, pad, pad}); };
    const Tensor plain = conv();
    w.freeze();
    const Tensor first = conv(), second = conv();
    EXPECT_TRUE(all_close(first, plain, 0, 0)) << shape_str(ws);
    EXPECT_TRUE(all_close(second, plain, 0, 0)) << shape_str(ws);
    w.unfreeze();
    w.fill_(0.25);
    const Tensor changed = conv();
    w.freeze();
    EXPECT_TRUE(all_close(conv(), changed, 0, 0)) << shape_str(ws);
    w.unfreeze();
  }
  const Tensor lw = random_tensor({40, 64}, 4, DType::f32).to(DType::bf16);
  const Tensor plain = linear(rows, lw, Tensor());
  lw.freeze();
  EXPECT_TRUE(all_close(linear(rows, lw, Tensor()), plain, 0, 0));
  EXPECT_TRUE(all_close(linear(rows, lw, Tensor()), plain, 0, 0));
  lw.unfreeze();
}

// Autotuning (planner.h): every convolution case, f32 and bf16, on whichever algorithm
// wins on this machine, and the timing happens once per shape and pass.
TEST(CpuBackend, AutotunedConvolutionsMatchReferenceAndTuneOnce) {
  cpu::set_conv_autotune(true);
  struct Off {
    ~Off() { cpu::set_conv_autotune(false); }
  } off;
  const std::vector<Case> cases = conv_cases_f32_and_bf16();
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
  }
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({4, 48, 6, 6}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  const Tensor w = random_tensor({40, 48, 3, 3}, 2, DType::f32).set_requires_grad(true);
  const Tensor w1 = random_tensor({24, 40, 1, 1}, 3, DType::f32).set_requires_grad(true);
  auto step = [&] { sum(conv2d(conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1}), w1, Tensor(), Conv2dParams{})).backward(); };
  const int64_t before = cpu::conv_autotune_runs();
  step();
  const int64_t first = cpu::conv_autotune_runs();
  // 3x3: direct, blocked, Winograd and im2col + matmul forward, direct, Winograd, the flipped forward
  // and col2im backward data, direct, Winograd and im2col + matmul weight gradient; 1x1: direct and
  // matmul for each pass, and col2im for the data gradient; duet's direct kernel for both forwards,
  // both weight gradients and the 3x3 data gradient where the CPU has AVX2; 4 timed runs each.
  // Below AVX-512 oneDNN builds no Winograd primitive, and the tuner skips the candidate.
  // duet's Winograd for the three passes of the 3x3 layer where the CPU has AVX2.
  const int winograd = cpu::cpu_caps().avx512 ? 3 : 0, own_direct = cpu::cpu_caps().avx2 ? 5 : 0;
  const int own_winograd = cpu::cpu_caps().avx2 ? 3 : 0;
  EXPECT_EQ(first - before, 4 * (3 + 3 + 2 + 2 + 3 + 2 + winograd + own_direct + own_winograd));
  step();
  EXPECT_EQ(cpu::conv_autotune_runs(), first) << "the second step timed algorithms again";
}

// Every matmul case on duet's small-matrix kernel (backends/cpu/small_gemm.h), forced on, and on
// oneDNN, forced off: the automatic choice depends on the thread count, so this checks both paths
// whatever it is.
TEST(CpuBackend, SmallGemmAndOneDnnMatmulsMatchReference) {
  if (!cpu::small_gemm_available()) std::printf("[ NOTE ] no AVX-512 here: the small-matrix kernel is not run\n");
  for (cpu::KernelPolicy p : {cpu::KernelPolicy::always, cpu::KernelPolicy::never}) {
    ScopedPolicy policy(cpu::set_small_gemm_policy, p);
    int n = 0;
    for (const Case& c : linalg_cases()) {
      if (c.name.rfind("matmul", 0) != 0) continue;
      SCOPED_TRACE(c.name + (p == cpu::KernelPolicy::always ? " (small gemm)" : " (oneDNN)"));
      expect_cpu_matches_reference(c);
      ++n;
    }
    EXPECT_GE(n, 15);
  }
}

// duet's product of at most four rows (backends/cpu/skinny_gemm.h): batch-1 inference's linear
// layers and pointwise convolutions on 1x1 and 2x2 maps, with each epilogue it takes (bias,
// residual, relu, relu6), forced on and forced off (oneDNN's matmul), against the reference
// backend; K and N around the kernel's 16-float chunks and 4-output blocks, and frozen weights
// computing the unfrozen bits. The automatic policy gives it the f32 products of at most four
// rows, and a NaN goes through its relu as through the reference's.
TEST(CpuBackend, SkinnyGemmMatchesReferenceAndOneDnn) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  const bool runs = cpu::small_gemm_available() || cpu::cpu_caps().avx2;  // AVX-512, or AVX2 with FMA
  if (!runs) std::printf("[ NOTE ] neither AVX-512 nor AVX2 here: the skinny kernel is not run\n");
  const auto on = [](Backend be, cpu::KernelPolicy p, const std::function<Tensor()>& f) {
    ScopedPolicy policy(cpu::set_skinny_gemm_policy, p);
    BackendGuard guard(DeviceType::cpu, be);
    return f();
  };
  const auto check = [&](const std::string& name, const std::function<Tensor()>& f) {
    SCOPED_TRACE(name);
    const Tensor want = on(Backend::reference, cpu::KernelPolicy::automatic, f);
    EXPECT_TRUE(all_close(on(Backend::cpu, cpu::KernelPolicy::always, f), want, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(on(Backend::cpu, cpu::KernelPolicy::never, f), want, 1e-5, 1e-5));
  };
  uint64_t seed = 1;
  for (const int64_t M : {1, 2, 3, 4, 5})
    for (const int64_t K : {1, 15, 16, 33, 200})
      for (const int64_t N : {1, 4, 6, 37, 70}) {
        const Tensor x = random_tensor({M, K}, seed++, DType::f32);
        const Tensor w = random_tensor({N, K}, seed++, DType::f32);
        const Tensor b = random_tensor({N}, seed++, DType::f32);
        const auto f = [&] { return linear(x, w, b); };
        check(fmt::format("linear {}x{} -> {}", M, K, N), f);
        if (runs) {
          EXPECT_EQ(impls_of(f) == cpu::skinny_gemm_impl(), M <= cpu::kSkinnyMaxRows) << impls_of(f);
          // A frozen weight gives the unfrozen bits.
          const Tensor plain = on(Backend::cpu, cpu::KernelPolicy::automatic, f);
          w.freeze();
          const Tensor first = on(Backend::cpu, cpu::KernelPolicy::automatic, f);
          const Tensor second = on(Backend::cpu, cpu::KernelPolicy::automatic, f);
          w.unfreeze();
          EXPECT_TRUE(all_close(first, plain, 0, 0));
          EXPECT_TRUE(all_close(second, plain, 0, 0));
        }
      }
  // 24 outputs: whole blocks of four; 26: a last block of two, whose epilogue goes through the
  // same four lanes from a buffer.
  for (const int64_t cout : {24, 26})
    for (const int64_t hw : {1, 2})
      for (const bool residual : {false, true})
        for (const std::optional<Activation> act : {std::optional<Activation>(), std::optional(Activation::relu),
                                                     std::optional(Activation::relu6)}) {
          const Tensor x =
              random_tensor({1, 40, hw, hw}, seed++, DType::f32, -4, 4).contiguous(MemoryFormat::channels_last);
          const Tensor w = random_tensor({cout, 40, 1, 1}, seed++, DType::f32);
          const Tensor b = random_tensor({cout}, seed++, DType::f32);
          const Tensor r = random_tensor({1, cout, hw, hw}, seed++, DType::f32).contiguous(MemoryFormat::channels_last);
          Conv2dParams p;
          p.act = act;
          const auto f = [&] { return conv2d(x, w, b, p, residual ? r : Tensor()); };
          check(fmt::format("pointwise {} outputs {}x{} residual {} act {}", cout, hw, hw, residual,
                            act ? activation_name(*act) : "none"),
                f);
          if (runs) {
            EXPECT_EQ(impls_of(f).rfind(cpu::skinny_gemm_impl(), 0), 0u) << impls_of(f);
          }
        }
  // A NaN input makes every output NaN, through relu and relu6 too, as on the reference backend.
  // (Where the kernel does not run, oneDNN's fused relu post-op turns NaN into 0.)
  std::vector<float> v(40, 0.5f);
  v[7] = NAN;
  const Tensor x = Tensor::from_vector<float>(v, {1, 40, 1, 1});
  const Tensor w = random_tensor({24, 40, 1, 1}, seed++, DType::f32);
  for (const Activation act : {Activation::relu, Activation::relu6}) {
    Conv2dParams p;
    p.act = act;
    const auto f = [&] { return conv2d(x, w, Tensor(), p); };
    for (const Backend be : {Backend::reference, Backend::cpu}) {
      if (be == Backend::cpu && !runs) continue;
      for (const float y : on(be, cpu::KernelPolicy::automatic, f).to_vector<float>())
        EXPECT_TRUE(std::isnan(y)) << activation_name(act) << " on " << backend_name(be);
    }
  }
  // Not the kernel's: bf16 (oneDNN's AMX and avx512_bf16 kernels).
  const Tensor xb = random_tensor({1, 40, 1, 1}, seed++, DType::bf16);
  const Tensor wb = random_tensor({24, 40, 1, 1}, seed++, DType::bf16);
  EXPECT_EQ(impls_of([&] { return conv2d(xb, wb, Tensor(), Conv2dParams{}); }).find("skinny"), std::string::npos);
}

// duet's direct kernel as a matrix product (backends/cpu/direct_conv.h), forced on, against the
// reference backend: linear layers of 5-65 rows with K past a chunk of the sum (1,152) and rows
// and outputs around the 6 x 16 tile, and pointwise convolutions on maps with a residual and
// relu/relu6; a frozen weight computes the unfrozen bits, a NaN goes through relu and relu6 as on
// the reference backend, and the automatic rule gives the kernel the products of at most
// kDirectMatmulMaxMacs multiply-adds on CPUs with AVX2 but not AVX-512.
TEST(CpuBackend, OwnDirectMatmulMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  if (!cpu::cpu_caps().avx2) GTEST_SKIP() << "duet's direct kernel needs AVX2 and FMA, which this CPU lacks";
  const auto on = [](Backend be, cpu::KernelPolicy p, const std::function<Tensor()>& f) {
    ScopedPolicy policy(cpu::set_direct_matmul_policy, p);
    BackendGuard guard(DeviceType::cpu, be);
    return f();
  };
  const auto forced_impl = [&](const std::function<Tensor()>& f) {
    ScopedPolicy policy(cpu::set_direct_matmul_policy, cpu::KernelPolicy::always);
    return impls_of(f);
  };
  uint64_t seed = 100;
  for (const int64_t M : {5, 6, 13, 65})
    for (const int64_t K : {1, 33, 1500})
      for (const int64_t N : {1, 16, 17, 70}) {
        SCOPED_TRACE(fmt::format("linear {}x{} -> {}", M, K, N));
        const Tensor x = random_tensor({M, K}, seed++, DType::f32);
        const Tensor w = random_tensor({N, K}, seed++, DType::f32);
        const Tensor b = random_tensor({N}, seed++, DType::f32);
        const auto f = [&] { return linear(x, w, b); };
        const Tensor plain = on(Backend::cpu, cpu::KernelPolicy::always, f);
        EXPECT_TRUE(all_close(plain, on(Backend::reference, cpu::KernelPolicy::automatic, f), 1e-4, 1e-4));
        EXPECT_EQ(forced_impl(f), cpu::kOwnDirectMatmul);
        w.freeze();
        const Tensor first = on(Backend::cpu, cpu::KernelPolicy::always, f);
        const Tensor second = on(Backend::cpu, cpu::KernelPolicy::always, f);
        w.unfreeze();
        EXPECT_TRUE(all_close(first, plain, 0, 0)) << "a frozen weight's kept panels give the unfrozen bits";
        EXPECT_TRUE(all_close(second, plain, 0, 0));
      }
  for (const bool residual : {false, true})
    for (const std::optional<Activation> act : {std::optional<Activation>(), std::optional(Activation::relu),
                                                 std::optional(Activation::relu6)}) {
      SCOPED_TRACE(fmt::format("pointwise residual {} act {}", residual, act ? activation_name(*act) : "none"));
      const Tensor x = random_tensor({2, 40, 3, 5}, seed++, DType::f32, -4, 4).contiguous(MemoryFormat::channels_last);
      const Tensor w = random_tensor({24, 40, 1, 1}, seed++, DType::f32);
      const Tensor b = random_tensor({24}, seed++, DType::f32);
      const Tensor r = random_tensor({2, 24, 3, 5}, seed++, DType::f32).contiguous(MemoryFormat::channels_last);
      Conv2dParams p;
      p.act = act;
      const auto f = [&] { return conv2d(x, w, b, p, residual ? r : Tensor()); };
      EXPECT_TRUE(all_close(on(Backend::cpu, cpu::KernelPolicy::always, f),
                            on(Backend::reference, cpu::KernelPolicy::automatic, f), 1e-4, 1e-4));
      EXPECT_EQ(forced_impl(f).rfind(cpu::kOwnDirectMatmul, 0), 0u) << forced_impl(f);
    }
  // A NaN at one pixel makes that pixel's outputs NaN through relu and relu6, and no other.
  const Tensor x = random_tensor({1, 40, 3, 3}, seed++, DType::f32).contiguous(MemoryFormat::channels_last);
  x.data<float>()[(1 * 3 + 1) * 40 + 7] = NAN;
  const Tensor w = random_tensor({24, 40, 1, 1}, seed++, DType::f32);
  for (const Activation act : {Activation::relu, Activation::relu6}) {
    Conv2dParams p;
    p.act = act;
    const Tensor y = on(Backend::cpu, cpu::KernelPolicy::always, [&] { return conv2d(x, w, Tensor(), p); });
    ASSERT_TRUE(y.is_contiguous(MemoryFormat::channels_last));
    int at_pixel = 0, elsewhere = 0;
    for (int64_t i = 0; i < y.numel(); ++i)
      (i / 24 == 4 ? at_pixel : elsewhere) += std::isnan(y.data<float>()[i]);
    EXPECT_EQ(at_pixel, 24) << activation_name(act) << ": every output channel of pixel (1, 1)";
    EXPECT_EQ(elsewhere, 0) << activation_name(act);
  }
  // The automatic rule: ViT-tiny's 65-row layers take the kernel, 128 rows of them (18.9 million
  // multiply-adds) stay on oneDNN; with AVX-512 everything does.
  const Tensor w768 = random_tensor({768, 192}, seed++, DType::f32);
  for (const int64_t M : {65, 128}) {
    const Tensor xm = random_tensor({M, 192}, seed++, DType::f32);
    const std::string impl = impls_of([&] { return linear(xm, w768, Tensor()); });
    const bool want = !cpu::small_gemm_available() && M * 192 * 768 <= cpu::kDirectMatmulMaxMacs;
    EXPECT_EQ(impl == cpu::kOwnDirectMatmul, want) << M << " rows: " << impl;
  }
}

// Attention's products, forward and backward, go to the small-matrix kernel on their own.
TEST(CpuBackend, AutomaticPolicyRunsAttentionOnSmallGemm) {
  if (!cpu::small_gemm_available()) GTEST_SKIP() << "no AVX-512 on this CPU: attention runs on oneDNN";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor q = random_tensor({8, 3, 65, 64}, 1, DType::f32).set_requires_grad(true);
  const Tensor k = random_tensor({8, 3, 65, 64}, 2, DType::f32).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  sum(matmul(softmax(matmul(q, k.transpose(-1, -2)), -1), k)).backward();
  profiler::enable(false);
  int small = 0;
  std::string all;
  for (const OpEvent& e : profiler::collect()) {
    if (std::string(e.name).rfind("matmul", 0) != 0) continue;
    all += std::string(e.name) + "=" + e.impl + " ";
    small += e.impl == "duet:small_gemm_avx512";
  }
  profiler::clear();
  EXPECT_EQ(small, 6) << all;  // two products, each with two backward products
}

// The fused attention's softmax subtracts each row's maximum score, taken over the row's S
// columns only (its scratch rows are padded to whole vectors): scores of -400 for every pair must
// give uniform probabilities, not exp(-400) / 0.
TEST(CpuBackend, FusedAttentionSoftmaxShiftsEachRowByItsOwnMaximum) {
  if (!cpu::small_gemm_available()) GTEST_SKIP() << "no AVX-512 on this CPU: attention runs on the reference loops";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const int64_t S = 17, D = 16;
  std::vector<float> packed(static_cast<size_t>(S * 3 * D));
  std::vector<double> mean_v(D, 0.0);
  for (int64_t i = 0; i < S; ++i)
    for (int64_t d = 0; d < D; ++d) {
      packed[i * 3 * D + d] = 10.0f;                                     // q
      packed[i * 3 * D + D + d] = -10.0f;                                // k: q.k = -1600, scaled -400
      const float v = static_cast<float>((i * 7 + d * 3) % 11) - 5.0f;  // v
      packed[i * 3 * D + 2 * D + d] = v;
      mean_v[d] += v / static_cast<double>(S);
    }
  const Tensor out = attention(Tensor::from_vector<float>(packed, {1, S, 3 * D}), 1);
  const std::vector<float> got = out.to_vector<float>();
  for (int64_t i = 0; i < S; ++i)
    for (int64_t d = 0; d < D; ++d) ASSERT_NEAR(got[i * D + d], mean_v[d], 1e-5) << "token " << i << " column " << d;
}

// The fused attention keeps its score rows in per-thread scratch padded to whole vectors. A NaN
// in one backward call's incoming gradient must not stay in that padding and poison the next
// call (two backward calls in a row, no forward between them to overwrite the scratch): the
// clean call matches the reference backend.
TEST(CpuBackend, FusedAttentionBackwardForgetsAnEarlierCallsNaN) {
  if (!cpu::small_gemm_available()) GTEST_SKIP() << "no AVX-512 on this CPU: attention runs on the reference loops";
  const int64_t N = 4, S = 17, heads = 2, D = 16;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D / heads));
  const Tensor qkv = random_tensor({N, S, 3 * D}, 1, DType::f32);
  const Tensor clean = random_tensor({N, S, D}, 2, DType::f32);
  const Tensor poisoned = Tensor::full({N, S, D}, std::numeric_limits<double>::quiet_NaN(), TensorOptions(DType::f32));
  BackendImpl& cpu = backend(Backend::cpu);
  const Tensor out = Tensor::empty({N, S, D}, TensorOptions(DType::f32));
  const Tensor probs = Tensor::empty({N, heads, S, S}, TensorOptions(DType::f32));
  cpu.attention(qkv, heads, scale, out, probs);
  const Tensor dqkv = Tensor::empty({N, S, 3 * D}, TensorOptions(DType::f32));
  cpu.attention_backward(qkv, probs, poisoned, heads, scale, dqkv);
  cpu.attention_backward(qkv, probs, clean, heads, scale, dqkv);
  const Tensor want = Tensor::empty({N, S, 3 * D}, TensorOptions(DType::f32));
  backend(Backend::reference).attention_backward(qkv, probs, clean, heads, scale, want);
  const std::vector<float> g = dqkv.to_vector<float>(), w = want.to_vector<float>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_NEAR(g[i], w[i], 1e-4) << "element " << i;
}

// f16 has no oneDNN CPU kernel: the cpu backend hands conv2d and linear to the reference backend's
// loops, and the profiler's implementation column says so and why (never a silent fallback).
TEST(CpuBackend, F16FallbackToTheReferenceIsNamedInTheImplementationColumn) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({2, 3, 6, 6}, 1, DType::f32).to(DType::f16);
  const Tensor w = random_tensor({4, 3, 3, 3}, 2, DType::f32).to(DType::f16);
  const Tensor a = random_tensor({5, 7}, 3, DType::f32).to(DType::f16);
  const Tensor lw = random_tensor({2, 7}, 4, DType::f32).to(DType::f16);
  profiler::clear();
  profiler::enable(true);
  const Tensor y = conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1});
  const Tensor z = linear(a, lw, Tensor());
  profiler::enable(false);
  int named = 0;
  std::string all;
  for (const OpEvent& e : profiler::collect()) {
    const std::string name = e.name;
    if (name != "conv2d" && name != "linear") continue;
    all += name + "=" + e.impl + " (" + backend_name(e.backend) + ") ";
    named += e.impl == "reference loops: f16 has no oneDNN 2.6 CPU kernel";
  }
  profiler::clear();
  EXPECT_EQ(named, 2) << all;
  // The numbers are the reference backend's own.
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  EXPECT_EQ(y.to(DType::f32).to_vector<float>(), conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1}).to(DType::f32).to_vector<float>());
  EXPECT_EQ(z.to(DType::f32).to_vector<float>(), linear(a, lw, Tensor()).to(DType::f32).to_vector<float>());
}

// Channels-last batch norm runs duet's row loops (not oneDNN's kernel) in f32 and bf16, forward
// and backward, and in f32 it is an order of magnitude closer to f64 than oneDNN 2.6's kernel:
// the sums are of values centred near the mean, so a mean of 1.5 standard deviations costs no
// digits (measured, relative L2 against f64: y 6e-8, dx 6e-8, dgamma 1.4e-7; oneDNN's kernel
// 1.2e-6, 4.9e-7, 2.1e-6).
TEST(CpuBackend, ChannelsLastBatchNormRunsAccurateLoops) {
  const Shape shape{16, 48, 12, 12};
  auto run = [&](Backend b, DType dt) {
    BackendGuard guard(DeviceType::cpu, b);
    const Tensor x64 = add(mul(random_tensor(shape, 1, DType::f64), Tensor::scalar(2.0, DType::f64)), Tensor::scalar(3.0, DType::f64));
    const Tensor x = x64.to(DType::f32).contiguous(MemoryFormat::channels_last).detach().set_requires_grad(true);
    const Tensor g = random_tensor({48}, 2, DType::f32).set_requires_grad(true);
    const Tensor beta = random_tensor({48}, 3, DType::f32).set_requires_grad(true);
    const Tensor dy = random_tensor(shape, 4, DType::f32).contiguous(MemoryFormat::channels_last);
    const Tensor xin = dt == DType::f64 ? x.to(DType::f64) : x.to(dt);
    const Tensor gin = dt == DType::f64 ? g.to(DType::f64) : g, bin = dt == DType::f64 ? beta.to(DType::f64) : beta;
    profiler::clear();
    profiler::enable(true);
    const Tensor y = batch_norm(xin, gin, bin, Tensor(), Tensor(), BatchNormParams{});
    sum(mul(y.to(DType::f64), dy.to(DType::f64))).backward();
    profiler::enable(false);
    std::string impls;
    for (const OpEvent& e : profiler::collect())
      if (std::string(e.name).starts_with("batch_norm")) impls += std::string(e.name) + "=" + e.impl + " ";
    profiler::clear();
    return std::make_tuple(y.to(DType::f64), x.grad().to(DType::f64), g.grad().to(DType::f64), impls);
  };
  auto rel = [](const Tensor& a, const Tensor& b) {
    const Tensor d = sub(a, b);
    return std::sqrt(sum(mul(d, d)).item() / sum(mul(b, b)).item());
  };
  const auto [y64, dx64, dg64, ref_impls] = run(Backend::reference, DType::f64);
  const auto [y, dx, dg, impls] = run(Backend::cpu, DType::f32);
  EXPECT_EQ(impls, "batch_norm=duet:bn_rows batch_norm.backward=duet:bn_rows ");
  EXPECT_LT(rel(y, y64), 3e-7);
  EXPECT_LT(rel(dx, dx64), 3e-7);
  EXPECT_LT(rel(dg, dg64), 6e-7);
  // bf16 data: the same loops, within bf16's rounding of x, y and dx.
  const auto [yb, dxb, dgb, bf16_impls] = run(Backend::cpu, DType::bf16);
  EXPECT_EQ(bf16_impls, "batch_norm=duet:bn_rows batch_norm.backward=duet:bn_rows ");
  EXPECT_LT(rel(yb, y64), 8e-3);
  EXPECT_LT(rel(dxb, dx64), 2e-2);
}

// Whether two tensors hold the same values bit for bit (in any layout).
bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor ac = a.contiguous(), bc = b.contiguous();
  return ac.dtype() == bc.dtype() && ac.shape() == bc.shape() &&
         std::memcmp(ac.raw_data(), bc.raw_data(), ac.nbytes()) == 0;
}

// A batch norm + ReLU or ReLU6 without a residual runs its backward as one op on the cpu backend,
// the mask recomputed from x (backends/cpu/batch_norm.cpp): the same bits as the activation's backward
// followed by the batch norm's, f32 and bf16, channels-last maps and [N, C] batches. With a
// residual, the mask still comes from y in relu.backward.
TEST(CpuBackend, BatchNormActivationBackwardInOneOpGivesTheTwoOpsBits) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  struct Grads {
    Tensor y, dx, dg, db;
    std::string ops;
  };
  for (const DType dt : {DType::f32, DType::bf16})
    for (const Activation act : {Activation::relu, Activation::relu6})
      for (const Shape& s : {Shape{4, 24, 6, 5}, Shape{70, 24}}) {
        SCOPED_TRACE(fmt::format("{} {} {}", dtype_name(dt), activation_name(act), shape_str(s)));
        const MemoryFormat f = s.size() == 4 ? MemoryFormat::channels_last : MemoryFormat::contiguous;
        // Scales and shifts that put outputs below 0, between 0 and 6, and above 6.
        const Tensor x0 = random_tensor(s, 1, DType::f32, -1.0, 3.0).contiguous(f);
        const Tensor dy = random_tensor(s, 4, DType::f32).to(dt).contiguous(f);
        const Tensor g0 = random_tensor({24}, 2, DType::f32, 0.5, 8.0);
        const Tensor b0 = random_tensor({24}, 3, DType::f32, -1.0, 4.0);
        const auto run = [&](bool in_one_op, const Tensor& residual) {
          const Tensor x = x0.detach().set_requires_grad(true);  // bf16 data: cast from an f32 leaf
          const Tensor g = g0.detach().set_requires_grad(true), b = b0.detach().set_requires_grad(true);
          BatchNormParams p;
          if (in_one_op) p.act = act;
          profiler::clear();
          profiler::enable(true);
          Tensor y = batch_norm(x.to(dt), g, b, Tensor(), Tensor(), p, in_one_op ? residual : Tensor());
          if (!in_one_op) y = activation(act, residual.defined() ? add(y, residual) : y);
          y.backward(dy);
          profiler::enable(false);
          std::string ops;
          for (const OpEvent& e : profiler::collect())
            if (std::string(e.name).find("backward") != std::string::npos && std::string(e.name) != "cast")
              ops += std::string(e.name) + " ";
          profiler::clear();
          return Grads{y, x.grad(), g.grad(), b.grad(), ops};
        };
        const Grads one = run(true, Tensor()), two = run(false, Tensor());
        const std::string fused = act == Activation::relu ? "batch_norm+relu.backward " : "batch_norm+relu6.backward ";
        EXPECT_EQ(one.ops, fused);
        EXPECT_TRUE(same_bits(one.y, two.y));
        EXPECT_TRUE(same_bits(one.dx, two.dx));
        EXPECT_TRUE(same_bits(one.dg, two.dg));
        EXPECT_TRUE(same_bits(one.db, two.db));
        // Both sides see some of each part of the activation.
        const Tensor y64 = one.y.to(DType::f64).contiguous();
        int64_t zero = 0, inside = 0;
        for (int64_t i = 0; i < y64.numel(); ++i) y64.data<double>()[i] == 0.0 ? ++zero : ++inside;
        EXPECT_GT(zero, y64.numel() / 10);
        EXPECT_GT(inside, y64.numel() / 10);
        const Tensor r = random_tensor(s, 5, DType::f32).to(dt).contiguous(f);
        const Grads with_residual = run(true, r);
        EXPECT_NE(with_residual.ops.find(std::string(activation_name(act)) + ".backward"), std::string::npos)
            << with_residual.ops;
        if (dt == DType::f32) {  // unfused, bf16 rounds bn(x) before the add
          EXPECT_TRUE(same_bits(with_residual.dx, run(false, r).dx));
        }
      }
  // The other backends take the mask as a pass of its own, and say so if asked for it.
  const Tensor x = random_tensor({8, 4}, 1, DType::f32), c = random_tensor({4}, 2, DType::f32);
  const Tensor dx = Tensor::empty_like(x);
  BackendImpl& ref = backend(Backend::reference);
  EXPECT_THROW(ref.batch_norm_backward(x, x, c, c, c, c, dx, Tensor(), Tensor(), 1e-5, Activation::relu), Error);
  EXPECT_FALSE(backend(Backend::reference).fuses_batch_norm_activation_backward(x));
  EXPECT_TRUE(backend(Backend::cpu).fuses_batch_norm_activation_backward(x));
  EXPECT_FALSE(backend(Backend::cpu).fuses_batch_norm_activation_backward(x.to(DType::f64)));
}

// Eval-mode batch norm of a slice of a channels-last tensor's channels (a DenseNet layer's input,
// models/densenet.cpp): the cpu backend's row loops read it where it lies, no copy op, and write
// the bits the same batch norm gives the slice copied dense, f32 and bf16, with and without ReLU.
// Where it cannot (training, a graph to record, another dtype), the front-end copies the slice
// channels-last first, with the same result.
TEST(CpuBackend, EvalBatchNormReadsChannelSlicesInPlace) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend is not built";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor wide = random_tensor({3, 40, 5, 6}, 1, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor g = random_tensor({24}, 2, DType::f32), b = random_tensor({24}, 3, DType::f32);
  const Tensor rm = random_tensor({24}, 4, DType::f32);
  const Tensor rv = add(mul(random_tensor({24}, 5, DType::f32), random_tensor({24}, 5, DType::f32)), Tensor::scalar(0.5));
  for (const DType dt : {DType::f32, DType::bf16})
    for (const bool relu : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + (relu ? " relu" : ""));
      BatchNormParams p;
      p.training = false;
      if (relu) p.act = Activation::relu;
      const Tensor slice = wide.to(dt).slice(1, 8, 32);
      ASSERT_EQ(channel_row_stride(slice), 40);
      const Tensor dense = slice.contiguous(MemoryFormat::channels_last);
      Tensor in_place, copied;
      std::string ops, impl;
      {
        NoGradGuard no_grad;
        for (const OpEvent& e : profiled_events([&] { in_place = batch_norm(slice, g, b, rm, rv, p); })) {
          ops += std::string(e.name) + " ";
          if (std::string(e.name).starts_with("batch_norm")) impl = e.impl;
        }
        copied = batch_norm(dense, g, b, rm, rv, p);
      }
      EXPECT_EQ(ops.find("copy"), std::string::npos) << ops;
      EXPECT_EQ(impl, "duet:bn_rows");
      EXPECT_TRUE(in_place.is_contiguous(MemoryFormat::channels_last));
      EXPECT_TRUE(same_bits(in_place, copied));
      // Recording a graph: the slice is copied channels-last first; same values, and gradients flow.
      const Tensor tracked = slice.detach().set_requires_grad(dt == DType::f32);
      const Tensor recorded = batch_norm(tracked, g, b, rm, rv, p);
      EXPECT_TRUE(same_bits(recorded.detach(), copied));
    }
  EXPECT_TRUE(backend(Backend::cpu).reads_channel_slices_in_batch_norm(wide.slice(1, 0, 8)));
  EXPECT_FALSE(backend(Backend::cpu).reads_channel_slices_in_batch_norm(wide.to(DType::f64).slice(1, 0, 8)));
  EXPECT_FALSE(backend(Backend::reference).reads_channel_slices_in_batch_norm(wide.slice(1, 0, 8)));
}

TEST(CpuBackend, AutomaticPolicyRunsResNetLayersOnWinograd) {
  DUET_SKIP_WITHOUT_AVX512("Winograd");
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  // oneDNN's Winograd rule alone: duet's would take this forward (64 tiles), as
  // AutomaticPolicyRunsStride1LayersOnOwnWinograd checks.
  ScopedPolicy no_own(cpu::set_own_winograd_policy, cpu::KernelPolicy::never);
  const Tensor x = random_tensor({16, 32, 8, 8}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  const Tensor w = random_tensor({32, 32, 3, 3}, 2, DType::f32).set_requires_grad(true);
  auto impls = [&] {
    profiler::clear();
    profiler::enable(true);
    sum(conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1})).backward();
    profiler::enable(false);
    std::string all;
    for (const OpEvent& e : profiler::collect())
      if (!e.impl.empty()) all += std::string(e.name) + "=" + e.impl + " ";
    profiler::clear();
    return all;
  };
  const std::string automatic = impls();
  size_t wino = 0;
  for (size_t at = automatic.find("jit_wino"); at != std::string::npos; at = automatic.find("jit_wino", at + 1)) ++wino;
  EXPECT_EQ(wino, 3u) << automatic;  // forward, backward data, backward weights
  cpu::set_winograd_policy(cpu::KernelPolicy::never);
  const std::string direct = impls();
  cpu::set_winograd_policy(cpu::KernelPolicy::automatic);
  EXPECT_EQ(direct.find("jit_wino"), std::string::npos) << direct;
}

// bf16 layers of 256 channels onto 8x8 maps run on f32 Winograd where bf16 has no AMX
// (planner.h), narrower ones on the bf16 kernels where bf16 dot products are fast (AMD Zen) and on
// Winograd too where bf16 computes in f32 (bf16_speed.h); the gradients equal the bf16 kernels'
// within bf16 rounding.
TEST(CpuBackend, AutomaticPolicyRunsWideBf16LayersOnF32Winograd) {
  DUET_SKIP_WITHOUT_AVX512("Winograd");
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  auto run = [](int64_t C, int64_t H) {
    // 16 images: Winograd needs 1,024 output pixels to amortise its weight transform
    const Tensor x = random_tensor({16, C, H, H}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
    const Tensor w = random_tensor({C, C, 3, 3}, 2, DType::f32, -0.05, 0.05).set_requires_grad(true);
    profiler::clear();
    profiler::enable(true);
    const Tensor y = conv2d(x.to(DType::bf16), w.to(DType::bf16), Tensor(), Conv2dParams{1, 1, 1, 1});
    EXPECT_EQ(y.dtype(), DType::bf16);
    sum(mul(y.to(DType::f32), y.to(DType::f32))).backward();
    profiler::enable(false);
    int wino = 0;
    for (const OpEvent& e : profiler::collect())
      if (std::string(e.name).rfind("conv2d", 0) == 0) wino += e.impl.find("jit_wino") != std::string::npos;
    profiler::clear();
    return std::make_tuple(wino, x.grad(), w.grad());
  };
  const auto [wide, dx_wino, dw_wino] = run(256, 8);
  EXPECT_EQ(wide, cpu::bf16_on_amx() ? 0 : 3);  // forward, backward data, backward weights
  EXPECT_EQ(std::get<0>(run(128, 8)), cpu::bf16_math_in_f32() ? 3 : 0);
  EXPECT_EQ(std::get<0>(run(256, 4)), 0);  // 256 output pixels: too few for Winograd in any dtype
  ScopedPolicy never(cpu::set_winograd_policy, cpu::KernelPolicy::never);
  const auto [none, dx_direct, dw_direct] = run(256, 8);
  EXPECT_EQ(none, 0);
  // Both round f32 sums of 2,304 products to bf16 (dx) and f32 gradients of bf16 outputs (dw).
  EXPECT_TRUE(all_close(dx_wino, dx_direct, 0.05, 2e-2));
  EXPECT_TRUE(all_close(dw_wino, dw_direct, 0.05, 2e-2));
}

// The implementation the profile names for the last `op` that `run` dispatched.

// A Winograd layer's weight gradient takes dy as its data gradient reordered it, inside the one
// conv2d_backward call that computes both (backends/cpu/conv.cpp), and computes the same bits as
// when it reorders dy itself (a call for the weight gradient alone).
TEST(CpuBackend, WeightGradientTakesTheDataGradientsReorderedDy) {
  DUET_SKIP_WITHOUT_AVX512("Winograd");
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x =
      random_tensor({16, 32, 8, 8}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  const Tensor w = random_tensor({32, 32, 3, 3}, 2, DType::f32).set_requires_grad(true);
  const Tensor dy = random_tensor({16, 32, 8, 8}, 3, DType::f32).contiguous(MemoryFormat::channels_last);
  const std::string wgrad_impl =
      profiled_impl("conv2d.backward_weight", [&] { conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1}).backward(dy); });
  EXPECT_NE(wgrad_impl.find("jit_wino"), std::string::npos) << wgrad_impl;
  EXPECT_NE(wgrad_impl.find("(dy as reordered for backward_data)"), std::string::npos) << wgrad_impl;
  // The weight gradient alone (the output mask without dx): it reorders dy itself.
  const Tensor dw = Tensor::empty(w.shape(), TensorOptions(DType::f32));
  const std::string alone_impl = profiled_impl("conv2d.backward_weight", [&] {
    detail::Dispatch<OpId::conv2d_backward> kernel(backend(Backend::cpu), {&dy, &x});
    kernel(dy, x.detach(), Tensor(), Tensor(), dw, Tensor(), Conv2dParams{1, 1, 1, 1});
  });
  EXPECT_NE(alone_impl.find("jit_wino"), std::string::npos) << alone_impl;
  EXPECT_EQ(alone_impl.find("(dy as reordered"), std::string::npos) << alone_impl;
  ASSERT_TRUE(w.grad().defined());
  EXPECT_TRUE(same_bits(w.grad(), dw));
}

// The profile of one conv2d_backward: the op's own window (the shared reorder of dy) and the two
// passes inside it, each with its implementation, the planner's reason and its FLOPs.
TEST(CpuBackend, ConvBackwardShowsEachPassWithItsReason) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x =
      random_tensor({16, 32, 8, 8}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  const Tensor w = random_tensor({32, 32, 3, 3}, 2, DType::f32).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1}).backward(Tensor::ones({16, 32, 8, 8}));
  profiler::enable(false);
  std::map<std::string, OpEvent> by_name;
  for (const OpEvent& e : profiler::collect()) by_name[e.name] = e;
  profiler::clear();
  ASSERT_TRUE(by_name.count("conv2d.backward") && by_name.count("conv2d.backward_data") &&
              by_name.count("conv2d.backward_weight"));
  const OpEvent &op = by_name["conv2d.backward"], &data = by_name["conv2d.backward_data"],
                &weight = by_name["conv2d.backward_weight"];
  EXPECT_LE(op.start_ns, data.start_ns);
  EXPECT_GE(op.end_ns, weight.end_ns) << "the passes run inside the op's window";
  EXPECT_EQ(op.flops, 0.0);
  EXPECT_DOUBLE_EQ(data.flops, 2.0 * 16 * 32 * 8 * 8 * 32 * 9);
  EXPECT_GT(weight.flops, 0.0);
  // oneDNN's Winograd where it has one (AVX-512), duet's below it with AVX2, else the direct kernel.
  const std::string reason =
      cpu::cpu_caps().avx512 ? "[winograd: 3x3 stride 1, 32->32 channels >= 32, output 8x8 >= 4x4, 1024 >= 1024 pixels]"
      : cpu::cpu_caps().avx2 ? "[duet winograd: 3x3 stride 1 below AVX-512, 32->32 channels >= 32, 64 tiles of 4x4 onto 8x8]"
                             : "[direct: no other rule applies]";
  for (const OpEvent* e : {&data, &weight}) EXPECT_NE(e->impl.find(reason), std::string::npos) << e->name << ": " << e->impl;
}

TEST(CpuBackend, ThreadCountIsSettable) {
  const int before = num_threads();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  {
    BackendGuard guard(DeviceType::cpu, Backend::cpu);
    const Tensor a = random_tensor({64, 70}, 1, DType::f32), b = random_tensor({70, 33}, 2, DType::f32);
    const Tensor c1 = matmul(a, b);
    set_num_threads(before);
    const Tensor c2 = matmul(a, b);
    EXPECT_TRUE(all_close(c1, c2, 1e-5, 1e-5));
  }
  set_num_threads(before);
  EXPECT_THROW(set_num_threads(0), Error);
}

// Reductions split across threads combine their partial sums in thread order: repeated runs
// with the same thread count give the same bits (channels-last bias-gradient pattern, few
// outputs, so the rows are split).
TEST(CpuBackend, ReductionsAreDeterministic) {
  const int before = num_threads();
  set_num_threads(2);
  {
    BackendGuard guard(DeviceType::cpu, Backend::cpu);
    const Tensor x = random_tensor({32, 24, 17, 19}, 5, DType::f32).contiguous(MemoryFormat::channels_last);
    const std::vector<float> first = sum(x, {0, 2, 3}).to_vector<float>();
    const std::vector<float> mean_first = mean(x, {0, 2, 3}).to_vector<float>();
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(sum(x, {0, 2, 3}).to_vector<float>(), first);
      EXPECT_EQ(mean(x, {0, 2, 3}).to_vector<float>(), mean_first);
    }
  }
  set_num_threads(before);
}
#endif

}  // namespace
}  // namespace duet
