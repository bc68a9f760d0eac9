// The CUDA backend on a real GPU: every case of the op table (opcheck/) against the reference
// backend, with two sets of input values, the caching allocator's reuse on the device, stream timing, the
// convolution-algorithm cache, and the errors that need a device to happen. Without a GPU each test
// reports itself as skipped, with the reason, never as passed (and fails with DUET_REQUIRE_CUDA=1).
#include <gtest/gtest.h>
#include "tests/test_support.h"

#ifdef DUET_HAVE_CUDA
#include <cmath>
#include <iostream>
#include <sstream>
#include <string>
#include "backends/cuda/conv_key.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/device.h"
#include "backends/cuda/event_timer.h"
#include "backends/cuda/nvml_telemetry.h"
#include "backends/cuda/selftest.h"
#include "engine/duet.h"
#include "engine/optim/optimizer.h"
#include "models/registry.h"
#include "opcheck/op_check.h"

using namespace duet;

#define DUET_REQUIRE_CUDA_DEVICE()                                                                     \
  do {                                                                                                 \
    if (duet::cuda_device_count() == 0) DUET_SKIP_WITHOUT_CUDA(duet::cuda::unavailable_reason());      \
  } while (0)

namespace {

void run_cases(uint64_t seed) {
  const opcheck::Target gpu = opcheck::device_target(Device::cuda(0));
  for (const opcheck::Case& c : opcheck::all_cases()) {
    if (!opcheck::skip_reason(c, gpu, opcheck::Mode::conformance).empty()) continue;
    const opcheck::Outcome o = opcheck::check_conformance(c, gpu, seed);
    for (const std::string& p : o.problems) ADD_FAILURE() << c.name << ": " << p;
  }
}

Device cuda0() { return Device::cuda(0); }

// A 3x3 convolution problem on cuda:0: batch n of 16x32x32 inputs, 32 filters, padding 1.
struct ConvOnGpu {
  Tensor x, w;
  Conv2dParams p;
};
ConvOnGpu conv_on_gpu(int64_t n) {
  ConvOnGpu c{Tensor::randn({n, 16, 32, 32}, TensorOptions().with_device(cuda0())),
              Tensor::randn({32, 16, 3, 3}, TensorOptions().with_device(cuda0())), {}};
  c.p.pad_h = c.p.pad_w = 1;
  return c;
}

}  // namespace

TEST(CudaDevice, OpsMatchReferenceSeed1) {
  DUET_REQUIRE_CUDA_DEVICE();
  run_cases(1);
}

TEST(CudaDevice, OpsMatchReferenceSeed2) {
  DUET_REQUIRE_CUDA_DEVICE();
  run_cases(2);
}

TEST(CudaDevice, CopiesRoundTripInEveryLayoutAndDtype) {
  DUET_REQUIRE_CUDA_DEVICE();
  const Tensor host = Tensor::arange(2 * 3 * 4 * 5, DType::f32).reshape({2, 3, 4, 5});
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8}) {
    const Tensor dev = host.to(dt).to(cuda0());
    EXPECT_EQ(dev.device(), cuda0());
    EXPECT_EQ(dev.to(Device::cpu()).to(DType::f32).to_vector<float>(), host.to(dt).to(DType::f32).to_vector<float>())
        << dtype_name(dt);
  }
  const Tensor cl = host.to(cuda0()).contiguous(MemoryFormat::channels_last);
  EXPECT_TRUE(cl.is_contiguous(MemoryFormat::channels_last));
  EXPECT_EQ(cl.to(Device::cpu()).contiguous().to_vector<float>(), host.to_vector<float>());
  // Device -> host into a non-contiguous destination.
  Tensor dst = Tensor::zeros({5, 4, 3, 2}).permute({3, 2, 1, 0});
  dst.copy_(host.to(cuda0()));
  EXPECT_EQ(dst.contiguous().to_vector<float>(), host.to_vector<float>());
  // Host broadcast source -> device.
  Tensor d2 = Tensor::zeros({3, 4}, TensorOptions().with_device(cuda0()));
  d2.copy_(Tensor::arange(4));
  EXPECT_EQ(d2.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}));
  EXPECT_EQ(Tensor::full({7}, 2.5, TensorOptions().with_device(cuda0())).to_vector<float>(), std::vector<float>(7, 2.5f));
}

// An upload returns without waiting for the stream, and the caller's buffer is free at once: its
// bytes were staged before the copy returned.
TEST(CudaDevice, UploadDoesNotWaitAndTheHostBufferIsFreeAtOnce) {
  DUET_REQUIRE_CUDA_DEVICE();
  const Tensor a = Tensor::randn({2048, 2048}, TensorOptions().with_device(cuda0()));
  for (int i = 0; i < 4; ++i) (void)matmul(a, a);  // keeps the stream busy while the uploads are queued
  std::vector<float> values(1 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = float(i % 1000);
  Tensor host = Tensor::from_vector<float>(values, {int64_t(values.size())});
  const Tensor dev = host.to(cuda0());
  host.fill_(-1.0);  // overwritten before the GPU has run the copy
  host = Tensor();
  const std::vector<float> back = dev.to(Device::cpu()).to_vector<float>();
  EXPECT_EQ(back, values);
  EXPECT_EQ(cuda::context(0, "test").staging().held_bytes() > 0, true);
}

TEST(CudaDevice, CopyBetweenDevices) {
  DUET_REQUIRE_CUDA_DEVICE();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs two CUDA devices, this machine has " << cuda_device_count();
  const Tensor host = Tensor::arange(60).reshape({3, 4, 5});
  const Tensor a = host.to(cuda0());
  const Tensor b = a.permute({2, 0, 1}).to(Device::cuda(1));
  EXPECT_EQ(b.device(), Device::cuda(1));
  EXPECT_EQ(b.to_vector<float>(), host.permute({2, 0, 1}).contiguous().to_vector<float>());
}

TEST(CudaDevice, AllocatorReusesBlocksAcrossSteps) {
  DUET_REQUIRE_CUDA_DEVICE();
  cuda::CachingAllocator& alloc = cuda::allocator(0);
  auto step = [] {
    Tensor x = Tensor::randn({64, 256}, TensorOptions().with_device(cuda0()));
    Tensor w = Tensor::randn({128, 256}, TensorOptions().with_device(cuda0()));
    return sum(relu(linear(x, w))).item();
  };
  step();
  const int64_t mallocs = alloc.caching_stats().source_allocs;
  const int64_t live = alloc.stats().current;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(alloc.caching_stats().source_allocs, mallocs) << "a repeated step must not call cudaMalloc";
  EXPECT_EQ(alloc.stats().current, live);
  EXPECT_GT(alloc.caching_stats().cache_hits, 0);
  EXPECT_GT(alloc.stats().cached, 0);
  const size_t released = alloc.release_cached();
  EXPECT_GT(released, 0u);
  EXPECT_EQ(alloc.stats().cached, 0);
}

TEST(CudaDevice, OutOfMemoryIsAnError) {
  DUET_REQUIRE_CUDA_DEVICE();
  try {
    (void)Tensor::empty({int64_t(1) << 50}, TensorOptions().with_device(cuda0()));  // 4 PiB
    FAIL() << "expected a duet::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cuda:0: out of memory"), std::string::npos) << msg;
    EXPECT_NE(msg.find("free of"), std::string::npos) << msg;
  }
  EXPECT_NO_THROW(Tensor::ones({16}, TensorOptions().with_device(cuda0())).item());  // the device is still usable
}

TEST(CudaDevice, BadDeviceIndexNamesTheDevices) {
  DUET_REQUIRE_CUDA_DEVICE();
  try {
    (void)Tensor::zeros({1}, TensorOptions().with_device(Device::cuda(cuda_device_count())));
    FAIL() << "expected a duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist: this machine has"), std::string::npos) << e.what();
  }
}

TEST(CudaDevice, InvalidLabelIsReportedFromTheDevice) {
  DUET_REQUIRE_CUDA_DEVICE();
  const Tensor logits = Tensor::zeros({3, 4}, TensorOptions().with_device(cuda0()));
  const Tensor target = Tensor::from_vector<int64_t>({0, 7, 2}, {3}, TensorOptions(DType::i64).with_device(cuda0()));
  // The loss does not wait for the GPU; reading it (a synchronisation) reports the label, once.
  const Tensor loss = cross_entropy(logits, target);
  try {
    (void)loss.item();
    FAIL() << "expected a duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target[1] = 7 is not a valid class label, expected 0 <= label < 4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NO_THROW((void)loss.item());
  // The backward records it as well (a caller may skip reading the loss).
  const Tensor lg = Tensor::zeros({3, 4}, TensorOptions().with_device(cuda0()).with_grad(true));
  const Tensor l2 = cross_entropy(lg, target);
  EXPECT_THROW(cuda::synchronize_all("test"), Error);
  l2.backward();
  EXPECT_THROW(cuda::synchronize_all("test"), Error);
  EXPECT_NO_THROW(cuda::synchronize_all("test"));
}

TEST(CudaDevice, StreamTimerMeasuresGpuTime) {
  DUET_REQUIRE_CUDA_DEVICE();
  cuda::DeviceContext& ctx = cuda::context(0, "test");
  const Tensor a = Tensor::randn({1024, 1024}, TensorOptions().with_device(cuda0()));
  cuda::StreamTimer timer(ctx);
  timer.start();
  Tensor c = matmul(a, a);
  for (int i = 0; i < 3; ++i) c = matmul(c, a);
  timer.stop();
  const double ms = timer.elapsed_ms();
  EXPECT_GT(ms, 0.0);
  EXPECT_LT(ms, 10000.0);
}

TEST(CudaDevice, ProfilerSeesGpuTimeAndCudnnAlgorithm) {
  DUET_REQUIRE_CUDA_DEVICE();
  const auto [x, w, p] = conv_on_gpu(8);
  (void)conv2d(x, w, Tensor(), p);  // warm-up: algorithm search, handle creation
  const int64_t hits = cuda::conv_algo_cache().hits();
  profiler::clear();
  profiler::enable(true);
  (void)conv2d(x, w, Tensor(), p);
  profiler::enable(false);
  EXPECT_EQ(cuda::conv_algo_cache().hits(), hits + 1);
  bool found = false;
  for (const OpEvent& e : profiler::collect()) {
    if (std::string(e.name) != "conv2d") continue;
    found = true;
    EXPECT_EQ(e.backend, Backend::cuda);
    EXPECT_NE(e.impl.find("cudnn"), std::string::npos) << e.impl;
    EXPECT_GT(e.end_ns, e.start_ns);
  }
  EXPECT_TRUE(found);
}

// Benchmark mode times the algorithms (cudnnFind) for a new problem, caches the winner under a key of
// its own, says so in the profile, and computes what the heuristics' choice computes.
TEST(CudaDevice, CudnnBenchmarkModeChoosesByTimingAndAgrees) {
  DUET_REQUIRE_CUDA_DEVICE();
  const auto [x0, w0, p] = conv_on_gpu(4);
  Tensor x = x0.detach(), w = w0.detach();
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  auto run = [&] {
    x.zero_grad();
    w.zero_grad();
    Tensor y = conv2d(x, w, Tensor(), p);
    sum(y * y).backward();
    return std::vector<Tensor>{y.to(Device::cpu()), x.grad().to(Device::cpu()), w.grad().to(Device::cpu())};
  };
  const std::vector<Tensor> heuristic = run();
  const bool before = cuda_cudnn_benchmark();
  cuda_set_cudnn_benchmark(true);
  const size_t cached = cuda::conv_algo_cache().size();
  profiler::clear();
  profiler::enable(true);
  const std::vector<Tensor> timed = run();
  profiler::enable(false);
  cuda_set_cudnn_benchmark(before);
  EXPECT_EQ(cuda::conv_algo_cache().size(), cached + 3) << "forward, backward data and backward filter, benchmarked";
  int seen = 0;
  for (const OpEvent& e : profiler::collect())
    if (std::string(e.name).rfind("conv2d", 0) == 0) {
      ++seen;
      EXPECT_NE(e.impl.find("(benchmarked)"), std::string::npos) << e.name << ": " << e.impl;
    }
  EXPECT_EQ(seen, 3);
  for (size_t i = 0; i < timed.size(); ++i) {
    const std::vector<float> a = timed[i].to_vector<float>(), b = heuristic[i].to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k)
      ASSERT_NEAR(a[k], b[k], 1e-3 + 1e-4 * std::abs(b[k])) << "tensor " << i << " element " << k;
  }
}

TEST(CudaDevice, PerOpTimesComeFromEventsResolvedAtStepEnd) {
  DUET_REQUIRE_CUDA_DEVICE();
  const auto [x, w, p] = conv_on_gpu(16);
  (void)relu(conv2d(x, w, Tensor(), p));  // warm-up
  cuda::synchronize_all("test");
  for (const bool sync : {false, true}) {
    profiler::clear();
    profiler::set_sync_per_op(sync);
    profiler::enable(true);
    profiler::step_begin(0, 16, cuda0());
    (void)sum(relu(conv2d(x, w, Tensor(), p)));
    profiler::step_end();
    profiler::enable(false);
    profiler::set_sync_per_op(false);
    const std::vector<StepEvent> steps = profiler::collect_steps();
    ASSERT_EQ(steps.size(), 1u);
    int64_t prev_end = 0;
    int n = 0;
    for (const OpEvent& e : profiler::collect()) {
      if (e.backend != Backend::cuda) continue;
      ++n;
      EXPECT_EQ(e.device_timed, !sync) << e.name;
      EXPECT_EQ(e.device_begin, -1) << "collect() returns resolved events";
      EXPECT_GE(e.end_ns, e.start_ns) << e.name;
      // Device times lie inside the step and in stream order (one stream: no overlap).
      EXPECT_GE(e.start_ns, steps[0].start_ns) << e.name;
      EXPECT_LE(e.end_ns, steps[0].end_ns) << e.name;
      EXPECT_GE(e.start_ns, prev_end) << e.name;
      prev_end = e.end_ns;
    }
    EXPECT_GE(n, 3) << "conv2d, relu and sum on the GPU";
  }
  EXPECT_EQ(cuda::event_timer().pending(), 0u);
}

TEST(CudaDevice, TrainingStepOnGpuMatchesCpu) {
  DUET_REQUIRE_CUDA_DEVICE();
  // A small conv net step (conv, BN, ReLU, pool, linear, cross-entropy, SGD) on both devices.
  auto step = [](Device d) {
    Generator g(5);
    Tensor x = Tensor::randn({4, 3, 16, 16}, {}, &g).to(d);
    Tensor w1 = Tensor::randn({8, 3, 3, 3}, {}, &g).to(d).detach().set_requires_grad(true);
    Tensor w2 = Tensor::randn({10, 8}, {}, &g).to(d).detach().set_requires_grad(true);
    Tensor gamma = Tensor::ones({8}, TensorOptions().with_device(d)).set_requires_grad(true);
    Tensor beta = Tensor::zeros({8}, TensorOptions().with_device(d)).set_requires_grad(true);
    Tensor rm = Tensor::zeros({8}, TensorOptions().with_device(d)), rv = Tensor::ones({8}, TensorOptions().with_device(d));
    Tensor target = Tensor::from_vector<int64_t>({1, 3, 5, 7}, {4}, TensorOptions(DType::i64).with_device(d));
    Conv2dParams p;
    p.pad_h = p.pad_w = 1;
    Tensor h = relu(batch_norm(conv2d(x, w1, Tensor(), p), gamma, beta, rm, rv, {}));
    h = adaptive_avg_pool2d(max_pool2d(h, {2, 2, 2, 2, 0, 0, true, false}), 1, 1).flatten(1);
    Tensor loss = cross_entropy(linear(h, w2), target, 0.1);
    loss.backward();
    for (Tensor* t : {&w1, &w2}) sgd_step_(*t, t->grad(), Tensor(), SgdParams{0.1, 0.0, 0.0, 0.0, false}, true);
    return std::vector<Tensor>{loss.to(Device::cpu()), w1.to(Device::cpu()), w2.to(Device::cpu()), rv.to(Device::cpu())};
  };
  std::vector<Tensor> ref;
  {
    BackendGuard guard(DeviceType::cpu, Backend::reference);
    ref = step(Device::cpu());
  }
  const std::vector<Tensor> got = step(cuda0());
  for (size_t i = 0; i < ref.size(); ++i) {
    const std::vector<float> a = got[i].to_vector<float>(), b = ref[i].to_vector<float>();
    ASSERT_EQ(a.size(), b.size());
    for (size_t k = 0; k < a.size(); ++k) EXPECT_NEAR(a[k], b[k], 1e-4 + 1e-3 * std::abs(b[k])) << "tensor " << i << " element " << k;
  }
}

// A channels-last model (Module::to) on channels-last inputs: cuDNN reads the weights and writes
// their gradients in NHWC directly, so a step copies nothing weight-shaped (before, each
// convolution copied its weight for the forward and the data gradient and its weight gradient
// back), and two steps of SGD with momentum give the cpu backend's parameters.
TEST(CudaDevice, ChannelsLastModelCopiesNoWeights) {
  DUET_REQUIRE_CUDA_DEVICE();
  auto run = [](Device d, bool check_copies) {
    manual_seed(7);
    auto model = models::create_model("resnet18_cifar", {.num_classes = 10, .width_mult = 0.25});
    model->to(d);
    model->to(MemoryFormat::channels_last);
    optim::SGD opt(model->parameters(), {.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
    std::vector<std::string> weight_shapes;
    for (const Tensor& p : model->parameters())
      if (p.dim() == 4 && p.size(2) > 1) weight_shapes.push_back(shape_str(p.shape()));
    Generator g(3);
    const Tensor labels = Tensor::from_vector<int64_t>({1, 3, 5, 7, 9, 0, 2, 4}, {8}).to(d);
    for (int step = 0; step < 2; ++step) {
      const Tensor x = Tensor::randn({8, 3, 32, 32}, {}, &g).contiguous(MemoryFormat::channels_last).to(d);
      profiler::clear();
      profiler::enable(check_copies && step == 1);
      cross_entropy((*model)(x), labels).backward();
      opt.step();
      model->zero_grad();
      profiler::enable(false);
      for (const OpEvent& e : profiler::collect())
        for (const std::string& ws : weight_shapes)
          EXPECT_FALSE(std::string(e.name) == "copy" && e.shapes.find(ws) != std::string::npos) << "weight copy: " << e.shapes;
      profiler::clear();
    }
    std::vector<Tensor> out;
    for (const Tensor& p : model->parameters()) out.push_back(p.to(Device::cpu()));
    return out;
  };
  const std::vector<Tensor> got = run(cuda0(), true), want = run(Device::cpu(), false);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const std::vector<float> a = got[i].to_vector<float>(), b = want[i].to_vector<float>();
    for (size_t k = 0; k < a.size(); ++k) ASSERT_NEAR(a[k], b[k], 2e-3 + 2e-3 * std::abs(b[k])) << "parameter " << i << " element " << k;
  }
}

TEST(CudaDevice, TelemetryReadsThePresentGpu) {
  DUET_REQUIRE_CUDA_DEVICE();
  if (!cuda::nvml_available()) GTEST_SKIP() << cuda::nvml_status();
  const cuda::GpuTelemetry t = cuda::sample_telemetry(0);
  EXPECT_TRUE(t.memory_total_bytes.has_value()) << t.note;
  EXPECT_TRUE(t.utilization_pct.has_value()) << t.note;
  std::cout << cuda::format_telemetry(t) << "\n";
}

// The whole table as `duet selftest --device cuda` prints it, plus the device's header and footer.
TEST(CudaDevice, SelftestPasses) {
  DUET_REQUIRE_CUDA_DEVICE();
  std::ostringstream os;
  os << cuda_selftest_header(0);
  EXPECT_EQ(opcheck::run_table(os, opcheck::all_cases(), opcheck::device_target(cuda0()), opcheck::Mode::conformance, "", 3), 0)
      << os.str();
  os << cuda_selftest_footer(0);
  std::cout << os.str();
}

#else
TEST(CudaDevice, NotBuilt) { DUET_SKIP_WITHOUT_CUDA("built without the CUDA backend (configure with -DDUET_CUDA=ON)"); }
#endif
