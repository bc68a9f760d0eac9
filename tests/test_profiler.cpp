// Profiler reports: FLOP and byte counts of recorded events against hand-computed values, table
// and step sums, the trace's required fields, the memory peak's op, compare, report loading
// errors, probe cache look-up, telemetry absence, sweeps.
#include <unistd.h>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>
#include <gtest/gtest.h>
#include "engine/duet.h"
#include "engine/ops/dispatch.h"
#include "test_support.h"
#include "engine/profiler/capture.h"
#include "reports/compare.h"
#include "reports/files.h"
#include "reports/memory_summary.h"
#include "reports/probe.h"
#include "reports/report.h"
#include "engine/profiler/session.h"
#include "reports/steps.h"
#include "reports/sweep.h"
#include "engine/profiler/telemetry.h"
#include "reports/trace.h"
#include "reports/text_table.h"

namespace duet {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Records what `f` dispatches, with nothing else in the buffers.
template <class F>
std::vector<OpEvent> record(F&& f) {
  profiler::clear();
  profiler::enable(true);
  f();
  profiler::enable(false);
  auto ev = profiler::collect();
  profiler::clear();
  return ev;
}

const OpEvent& find(const std::vector<OpEvent>& ev, const std::string& name) {
  for (const OpEvent& e : ev)
    if (name == e.name) return e;
  ADD_FAILURE() << "no event named " << name;
  static OpEvent none;
  return none;
}

// A temporary folder, removed at the end of the test.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / fmt::format("duet-prof-test-{}-{}", ::getpid(), counter()++);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
  static int& counter() {
    static int c = 0;
    return c;
  }
};

void write_text(const std::string& path, const std::string& s) {
  std::ofstream(path) << s;
}

// A few steps of conv + bn + relu + pool + linear + softmax, forward and backward, between step
// markers; the report is built without a probe.
json small_training_report(int steps = 3, TimingMode mode = TimingMode::per_op) {
  manual_seed(1);
  Tensor w = Tensor::randn({8, 3, 3, 3}).set_requires_grad(true);
  Tensor gamma = Tensor::ones({8}).set_requires_grad(true), beta = Tensor::zeros({8}).set_requires_grad(true);
  Tensor fc = Tensor::randn({10, 8 * 8 * 8}).set_requires_grad(true);
  profiler::start_session({.mode = mode, .telemetry_ms = 5});
  for (int s = 0; s < steps; ++s) {
    profiler::step_begin(s, 4);
    Tensor x, loss;
    {
      profiler::PhaseGuard data(Phase::data);
      x = Tensor::randn({4, 3, 16, 16});
    }
    {
      profiler::PhaseGuard fwd(Phase::forward);
      Tensor h;
      {
        profiler::ScopeGuard scope("conv1");
        h = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
      }
      {
        profiler::ScopeGuard scope("bn1");
        h = relu(batch_norm(h, gamma, beta, Tensor(), Tensor(), {}));
      }
      h = max_pool2d(h, {});
      {
        profiler::ScopeGuard scope("fc");
        h = linear(h.flatten(1), fc);
      }
      loss = sum(softmax(h, 1) * h);
    }
    loss.backward();
    {
      profiler::PhaseGuard opt(Phase::optimizer);
      for (Tensor* p : {&w, &gamma, &beta, &fc}) {
        p->copy_(*p - p->grad() * 0.01);
        p->zero_grad();
      }
    }
    profiler::step_end();
  }
  profiler::stop_session();
  const json r = profiler::build_report(profiler::capture(), {{"model", "tiny"}, {"batch", 4}}, {.use_probe = false});
  profiler::clear();
  return r;
}

// ---- FLOP and byte counts, hand-computed ----------------------------------------------------

TEST(ProfilerCost, Conv2dEventFlopsAndBytes) {
  const Tensor x = Tensor::randn({2, 3, 8, 8}), w = Tensor::randn({4, 3, 3, 3}), b = Tensor::randn({4});
  auto ev = record([&] { conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1}); });
  const OpEvent& e = find(ev, "conv2d");
  // y [2,4,8,8] = 512 outputs, each 3*3*3 = 27 multiply-adds: 2 * 512 * 27 FLOPs.
  EXPECT_DOUBLE_EQ(e.flops, 27648);
  // x 384 + w 108 + y 512 floats, 4 bytes each.
  EXPECT_DOUBLE_EQ(e.bytes, 4016);
  EXPECT_EQ(e.shapes, "[2, 3, 8, 8] [4, 3, 3, 3]");
  EXPECT_EQ(e.phase, Phase::other);
  auto evb = record([&] { conv2d(x, w, b, {.pad_h = 1, .pad_w = 1}); });
  const OpEvent& eb = find(evb, "conv2d");
  EXPECT_DOUBLE_EQ(eb.flops, 27648 + 512);  // one add per output for the bias
  EXPECT_DOUBLE_EQ(eb.bytes, 4016 + 16);
}

TEST(ProfilerCost, MatmulEventFlopsAndBytes) {
  const Tensor a = Tensor::randn({5, 7}), b = Tensor::randn({7, 3});
  auto ev = record([&] { matmul(a, b); });
  const OpEvent& e = find(ev, "matmul");
  EXPECT_DOUBLE_EQ(e.flops, 2.0 * 5 * 3 * 7);         // 210
  EXPECT_DOUBLE_EQ(e.bytes, 4.0 * (35 + 21 + 15));  // 284
}

TEST(ProfilerCost, BatchNormEventFlopsAndBytes) {
  const Tensor x = Tensor::randn({2, 3, 4, 4}), g = Tensor::ones({3}), b = Tensor::zeros({3});
  auto ev = record([&] { batch_norm(x, g, b, Tensor(), Tensor(), {}); });
  const OpEvent& e = find(ev, "batch_norm");
  EXPECT_DOUBLE_EQ(e.flops, 8.0 * 96);      // training: ~8 FLOPs per element
  EXPECT_DOUBLE_EQ(e.bytes, 2.0 * 96 * 4);  // read x, write y
}

TEST(ProfilerCost, PoolingEventFlopsAndBytes) {
  const Tensor x = Tensor::randn({1, 2, 4, 4});
  auto ev = record([&] { max_pool2d(x, {}); });
  const OpEvent& e = find(ev, "max_pool2d");
  EXPECT_DOUBLE_EQ(e.flops, 8.0 * 4);          // 8 outputs, a 2x2 window each
  EXPECT_DOUBLE_EQ(e.bytes, 4.0 * (32 + 8));  // 160
}

TEST(ProfilerCost, SoftmaxEventFlopsAndBytes) {
  const Tensor x = Tensor::randn({3, 5});
  auto ev = record([&] { softmax(x, 1); });
  const OpEvent& e = find(ev, "softmax");
  EXPECT_DOUBLE_EQ(e.flops, 5.0 * 15);
  EXPECT_DOUBLE_EQ(e.bytes, 2.0 * 15 * 4);
}

TEST(ProfilerCost, BroadcastOperandIsReadOnceAndShownAsGiven) {
  const Tensor a = Tensor::randn({2, 3, 4, 4}), b = Tensor::randn({1, 3, 1, 1});
  auto ev = record([&] { add(a, b); });
  const OpEvent& e = find(ev, "add");
  EXPECT_DOUBLE_EQ(e.flops, 96);                    // one add per output element
  EXPECT_DOUBLE_EQ(e.bytes, 4.0 * (96 + 3 + 96));  // a, b's 3 distinct values, the output
  EXPECT_EQ(e.shapes, "[2, 3, 4, 4] [1, 3, 1, 1]");
}

// Every op's label and cost come from its line of ops.def, through Dispatch.
TEST(ProfilerCost, LabelsComeFromOpsDef) {
  const Tensor x = Tensor::randn({2, 3, 4, 4}), w = Tensor::randn({3, 3, 1, 1});
  auto ev = record([&] {
    conv2d(x, w, Tensor(), {.act = Activation::relu});
    conv2d(x, w, Tensor(), {.act = Activation::relu6}, x);
    x.to(DType::f64);
    leaky_relu(x, 0.1);
    mean(x, {1});
    log_softmax(x.flatten(1), 1);
  });
  for (const char* name : {"conv2d+relu", "conv2d+add+relu6", "cast", "leaky_relu", "mean", "log_softmax"}) find(ev, name);
}

namespace {
// A host backend that declares no kernel for activations: Dispatch must hand them to the reference
// loops and say so.
struct CpuWithoutActivations final : BackendImpl {
  Backend kind() const override { return Backend::cpu; }
  DTypeSupport support(OpId op, DType) const override {
    if (op == OpId::activation) return {Coverage::reference_loops, "the cpu backend has no activation kernel"};
    return {};
  }
};
// A device backend that declares it does not take f64 activations, and one that declares every op
// (the default) but has no activation kernel.
struct CudaWithoutF64Activations final : BackendImpl {
  Backend kind() const override { return Backend::cuda; }
  DTypeSupport support(OpId op, DType dt) const override {
    if (op == OpId::activation && dt == DType::f64) return {Coverage::refused, "expected f32"};
    return {};
  }
};
struct CudaWithoutActivations final : BackendImpl {
  Backend kind() const override { return Backend::cuda; }
};
}  // namespace

TEST(Dispatch, HostBackendWithoutAKernelFallsBackToTheReferenceVisibly) {
  CpuWithoutActivations partial;
  EXPECT_EQ(&detail::backend_for(partial, OpId::conv2d, DType::f32), &partial);
  EXPECT_EQ(&detail::backend_for(partial, OpId::activation, DType::f32), &backend(Backend::reference));
  const Tensor x = Tensor::from_vector(std::vector<float>{-1, 2, -3, 4}, {4});
  Tensor y;
  auto ev = record([&] {
    detail::Dispatch<OpId::activation> kernel(partial, {&x});
    y = Tensor::empty({4});
    kernel(Activation::relu, 0.0, x, y);
  });
  const OpEvent& e = find(ev, "relu");
  EXPECT_EQ(e.backend, Backend::reference);
  EXPECT_EQ(e.impl, "reference loops: the cpu backend has no activation kernel");
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0, 2, 0, 4}));
}

TEST(Dispatch, DeviceBackendRefusesADTypeItDeclinesBeforeAnyWork) {
  CudaWithoutF64Activations partial;
  EXPECT_EQ(&detail::backend_for(partial, OpId::activation, DType::f32), &partial);
  const Tensor x = Tensor::zeros({4}, TensorOptions(DType::f64));
  EXPECT_ERROR_HAS(detail::Dispatch<OpId::activation>(partial, {&x}),
                   "activation on backend 'cuda' does not take dtype f64: expected f32");
}

TEST(Dispatch, DeviceBackendWithoutAKernelNamesTheMissingOp) {
  CudaWithoutActivations partial;
  EXPECT_EQ(&detail::backend_for(partial, OpId::activation, DType::f32), &partial);  // no host fallback for device tensors
  const Tensor x = Tensor::zeros({4}), y = Tensor::empty({4});
  detail::Dispatch<OpId::activation> kernel(partial, {&x});
  EXPECT_ERROR_HAS(kernel(Activation::relu, 0.0, x, y), "activation is not implemented on backend 'cuda'");
}

// ---- steps and tables ---------------------------------------------------------------------

TEST(ProfilerSteps, OpTimesAddUpToTheStep) {
  const Tensor a = Tensor::randn({192, 192}), b = Tensor::randn({192, 192});
  profiler::start_session({.telemetry_ms = 0});
  profiler::step_begin(0, 8);
  {
    profiler::PhaseGuard fwd(Phase::forward);
    for (int i = 0; i < 6; ++i) (void)matmul(a, b);
  }
  profiler::step_end();
  profiler::stop_session();
  const profiler::Capture c = profiler::capture();
  ASSERT_EQ(c.steps.size(), 1u);
  ASSERT_EQ(c.ops.size(), 6u);
  const json r = profiler::build_report(c, json::object(), {.use_probe = false});
  const int64_t step = c.steps[0].end_ns - c.steps[0].start_ns;
  const int64_t ops = r["totals"]["op_self_ns"].get<int64_t>();
  EXPECT_LE(ops, step);
  EXPECT_GE(static_cast<double>(ops), 0.3 * static_cast<double>(step)) << "timer overhead should be small next to 6 GEMMs";
  // The breakdown: forward ops + untracked = the step exactly.
  const json& ph = r["phases"];
  EXPECT_EQ(ph["mean_ops_ns"]["forward"].get<double>(), static_cast<double>(ops));
  EXPECT_DOUBLE_EQ(ph["mean_ops_ns"]["forward"].get<double>() + ph["mean_untracked_ns"].get<double>(),
                   ph["mean_step_ns"].get<double>());
  // Self times sum over the table; with no nesting self == total.
  int64_t self = 0, total = 0;
  for (const auto& row : r["op_table"]) {
    self += row["self_ns"].get<int64_t>();
    total += row["total_ns"].get<int64_t>();
  }
  EXPECT_EQ(self, ops);
  EXPECT_EQ(self, total);
  EXPECT_EQ(r["op_table"][0]["key"], "matmul");
  EXPECT_EQ(r["op_table"][0]["calls"], 6);
  EXPECT_NEAR(r["op_table"][0]["pct"].get<double>(), static_cast<double>(ops) / static_cast<double>(step), 1e-12);
  EXPECT_DOUBLE_EQ(r["phases"]["images_per_s"].get<double>(), 8.0 / (static_cast<double>(step) * 1e-9));
  EXPECT_EQ(r["timing_mode"], "per-op");
  EXPECT_EQ(r["schema"], "duet.profile/1");
  profiler::clear();
}

TEST(ProfilerSteps, OpsOutsideStepsAreCountedNotTabled) {
  const Tensor a = Tensor::randn({8, 8});
  profiler::start_session({.telemetry_ms = 0});
  (void)matmul(a, a);  // before the step
  profiler::step_begin(0);
  (void)add(a, a);
  profiler::step_end();
  profiler::stop_session();
  const json r = profiler::build_report(profiler::capture(), json::object(), {.use_probe = false});
  EXPECT_EQ(r["totals"]["ops_outside_steps"]["count"], 1);
  ASSERT_EQ(r["op_table"].size(), 1u);
  EXPECT_EQ(r["op_table"][0]["key"], "add");
  profiler::clear();
}

TEST(ProfilerSteps, NestedStepBeginIsAnError) {
  profiler::start_session({.telemetry_ms = 0});
  profiler::step_begin(1);
  try {
    profiler::step_begin(2);
    FAIL() << "expected duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("step 1 is still open"), std::string::npos) << e.what();
  }
  profiler::stop_session();
  profiler::clear();
}

TEST(ProfilerSteps, SelfTimeExcludesNestedOps) {
  std::vector<OpEvent> ev(3);
  ev[0].name = "outer";
  ev[0].start_ns = 0;
  ev[0].end_ns = 100;
  ev[1].name = "inner";
  ev[1].start_ns = 10;
  ev[1].end_ns = 40;
  ev[2].name = "inner2";
  ev[2].start_ns = 50;
  ev[2].end_ns = 60;
  const auto self = profiler::self_times(ev);
  EXPECT_EQ(self[0], 60);
  EXPECT_EQ(self[1], 30);
  EXPECT_EQ(self[2], 10);
}

TEST(ProfilerSteps, TimingModeSurvivesNestedEnableAndRepeatedStop) {
  profiler::start_session({.mode = TimingMode::throughput, .telemetry_ms = 0});
  profiler::enable(true);  // a helper profiling briefly (models::model_stats does this)
  EXPECT_EQ(profiler::timing_mode(), TimingMode::per_op);
  profiler::enable(false);
  EXPECT_EQ(profiler::timing_mode(), TimingMode::throughput);
  EXPECT_TRUE(profiler::recording());
  profiler::stop_session();
  profiler::stop_session();  // finish_profile stops again: harmless
  EXPECT_EQ(profiler::timing_mode(), TimingMode::throughput);
  EXPECT_FALSE(profiler::recording());
  profiler::clear();
}

TEST(ProfilerSteps, ThroughputModeRecordsStepsButNoOps) {
  const json r = small_training_report(2, TimingMode::throughput);
  EXPECT_EQ(r["timing_mode"], "throughput");
  EXPECT_EQ(r["op_records"].size(), 0u);
  EXPECT_EQ(r["phases"]["steps"], 2);
  ASSERT_TRUE(r["phases"]["mean_wall_ns"].is_object());
  EXPECT_GT(r["phases"]["mean_wall_ns"]["forward"].get<double>(), 0);
  EXPECT_GT(r["phases"]["mean_wall_ns"]["backward"].get<double>(), 0);
  const std::string text = profiler::format_report(r, {});
  EXPECT_NE(text.find("throughput mode"), std::string::npos) << text;
}

// The header names the cpu backend's kernel choices (DUET_WINOGRAD=0, autotuning, ...) only where
// one differs from the default, so a report says whether it ran the usual algorithms.
TEST(ProfilerReport, HeaderNamesChangedCpuKernelChoices) {
  json r = small_training_report(1, TimingMode::throughput);
  r["machine"]["cpu_kernels"] = {{"winograd", "automatic"}, {"pointwise_gemm", "automatic"}, {"conv_autotune", false}};
  EXPECT_EQ(profiler::format_report(r, {}).find("cpu kernels"), std::string::npos);
  r["machine"]["cpu_kernels"]["winograd"] = "never";
  r["machine"]["cpu_kernels"]["conv_autotune"] = true;
  const std::string text = profiler::format_report(r, {});
  EXPECT_NE(text.find("cpu kernels conv_autotune=true winograd=never"), std::string::npos) << text;
}

// The header says when bf16 convolutions and matrix products ran on the reference loops (no AVX-512
// for oneDNN), so that a slow bf16 report explains itself; the machine record of a report made here
// says where they run.
TEST(ProfilerReport, HeaderSaysWhereCpuBf16Runs) {
  json r = small_training_report(1, TimingMode::throughput);
#ifdef DUET_HAVE_DNNL
  const bool native = testing::cpu_bf16_convolutions_not_native().empty();
  EXPECT_EQ(r["machine"].value("cpu_bf16", std::string()), native ? "onednn" : "reference_loops");
#endif
  const char* note = "bf16 on the reference loops";
  r["machine"]["cpu_bf16"] = "onednn";
  EXPECT_EQ(profiler::format_report(r, {}).find(note), std::string::npos);
  r["machine"]["cpu_bf16"] = "reference_loops";
  const std::string text = profiler::format_report(r, {});
  EXPECT_NE(text.find(note), std::string::npos) << text;
}

// The header names the CPU's family and model numbers beside its model name, which a virtual
// machine may reduce to the vendor ("AMD EPYC" on Zen 4 and on Zen 5 alike).
TEST(ProfilerReport, HeaderNamesTheCpuGeneration) {
  json r = small_training_report(1, TimingMode::throughput);
  r["machine"]["cpu_model"] = "AMD EPYC";
  r["machine"]["cpu_family"] = "26";
  r["machine"]["cpu_model_number"] = "2";
  std::string text = profiler::format_report(r, {});
  EXPECT_NE(text.find("machine: AMD EPYC (family 26 model 2) ("), std::string::npos) << text;
  r["machine"].erase("cpu_family");  // a report written before the numbers were kept
  text = profiler::format_report(r, {});
  EXPECT_NE(text.find("machine: AMD EPYC ("), std::string::npos) << text;
}

TEST(ProfilerTables, LayerTableCarriesForwardScopeIntoBackward) {
  const json r = small_training_report();
  bool conv_fwd = false, conv_bwd = false;
  for (const auto& row : r["layer_table"]) {
    if (row["key"] == "conv1" && row["phase"] == "forward") conv_fwd = true;
    if (row["key"] == "conv1" && row["phase"] == "backward") {
      conv_bwd = true;
      EXPECT_NE(row["ops"].get<std::string>().find("conv2d.backward_weight"), std::string::npos) << row.dump();
    }
  }
  EXPECT_TRUE(conv_fwd);
  EXPECT_TRUE(conv_bwd);
  // Wall time per phase covers the step; ops cover no more than it.
  const json& ph = r["phases"];
  double wall = 0, ops = 0;
  for (auto it = ph["mean_wall_ns"].begin(); it != ph["mean_wall_ns"].end(); ++it) wall += it.value().get<double>();
  for (auto it = ph["mean_ops_ns"].begin(); it != ph["mean_ops_ns"].end(); ++it) ops += it.value().get<double>();
  EXPECT_NEAR(wall, ph["mean_step_ns"].get<double>(), 1.0);
  EXPECT_LE(ops, ph["mean_step_ns"].get<double>());
}

TEST(ProfilerTables, GroupBySortAndTopN) {
  const json r = small_training_report();
  const auto records = profiler::records_of(r);
  const auto basis = profiler::basis_of(r);
  const auto by_name = profiler::op_table(records, basis, std::nullopt, {});
  const auto by_shape = profiler::op_table(records, basis, std::nullopt, {.by_shape = true});
  EXPECT_GE(by_shape.size(), by_name.size());
  for (size_t i = 1; i < by_name.size(); ++i) EXPECT_GE(by_name[i - 1].self_ns, by_name[i].self_ns);
  const auto by_calls = profiler::op_table(records, basis, std::nullopt, {.sort = "calls"});
  for (size_t i = 1; i < by_calls.size(); ++i) EXPECT_GE(by_calls[i - 1].calls, by_calls[i].calls);
  EXPECT_THROW(profiler::op_table(records, basis, std::nullopt, {.sort = "speed"}), Error);
  const std::string text = profiler::format_op_table(by_name, 3, false, "% step");
  EXPECT_NE(text.find(fmt::format("({} more rows)", by_name.size() - 3)), std::string::npos) << text;
  // Forward and backward ops are separate rows.
  bool fwd = false, bwd = false;
  for (const auto& row : by_name) {
    fwd = fwd || row.key == "conv2d";
    bwd = bwd || row.key == "conv2d.backward_data" || row.key == "conv2d.backward_weight";
  }
  EXPECT_TRUE(fwd && bwd);
  const std::string csv = profiler::op_table_csv(by_shape, "per-op");
  EXPECT_NE(csv.find("\"[4, 3, 16, 16]"), std::string::npos) << "shapes hold commas and must be quoted";
  EXPECT_NE(csv.find(",per-op\n"), std::string::npos) << "every row names its timing mode";
}

// Two layers of one shape that ran the same implementation give one name in the shape row, even
// when the name holds commas (the planner's reasons do); a third and a fourth are listed, then "...".
TEST(ProfilerTables, ShapeRowListsEachImplementationOnce) {
  const json r = small_training_report();
  const auto basis = profiler::basis_of(r);
  profiler::OpRecord a;
  a.name = "conv2d";
  a.phase = "forward";
  a.backend = "cpu";
  a.dtype = "f32";
  a.device = "cpu";
  a.shapes = "[1, 64, 8, 8] [256, 64, 1, 1]";
  a.impl = "matmul/brg:avx512_core [matrix product: pointwise, 64 rows <= 1024]";
  a.calls = 1;
  a.self_ns = a.total_ns = 1000;
  std::vector<profiler::OpRecord> records{a, a};
  records[1].scope = "layer2";
  auto rows = profiler::op_table(records, basis, std::nullopt, {.by_shape = true});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].impl, a.impl);
  for (const char* other : {"jit:avx512_core", "brgconv:avx512_core", "gemm:jit"}) {
    records.push_back(a);
    records.back().impl = other;
  }
  rows = profiler::op_table(records, basis, std::nullopt, {.by_shape = true});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].impl, a.impl + " | jit:avx512_core | brgconv:avx512_core | ...");
}

TEST(ProfilerTables, BoundAgainstCeilings) {
  profiler::Ceilings c;
  c.gemm_gflops = 100;
  c.copy_gbs = 10;  // ridge at 10 FLOP/byte
  EXPECT_DOUBLE_EQ(c.ridge(), 10);
  EXPECT_EQ(profiler::bound_of(1e9, 1e9, c), "memory");
  EXPECT_EQ(profiler::bound_of(1e11, 1e9, c), "compute");
  EXPECT_EQ(profiler::bound_of(0, 1e6, c), "memory");
  EXPECT_EQ(profiler::bound_of(0, 0, c), "");
  EXPECT_EQ(profiler::bound_of(1e9, 1e9, std::nullopt), "");
  EXPECT_DOUBLE_EQ(c.attainable_gflops(2), 20);
  EXPECT_DOUBLE_EQ(c.attainable_gflops(50), 100);
  // 16-bit FLOPs go against the bf16 GEMM's ceiling, four times fp32's here (ridge 40 FLOP/byte).
  c.gemm_bf16_gflops = 400;
  EXPECT_DOUBLE_EQ(c.compute_ns(1e9), 1e7);  // ns
  EXPECT_DOUBLE_EQ(c.compute_ns(1e9, 1e9), 2.5e6);
  EXPECT_DOUBLE_EQ(c.compute_ns(2e9, 1e9), 1e7 + 2.5e6);
  EXPECT_DOUBLE_EQ(c.memory_ns(1e9), 1e8);
  EXPECT_EQ(profiler::bound_of(2e10, 1e9, c), "compute");
  EXPECT_EQ(profiler::bound_of(2e10, 1e9, c, 2e10), "memory");
  c.gemm_bf16_gflops = 0;  // not measured: fp32's ceiling for all
  EXPECT_DOUBLE_EQ(c.compute_ns(1e9, 1e9), 1e7);
}

// The roof column of an autocast step: a bf16 product is held against the bf16 ceiling, an f32
// one against fp32's, each row by its own records' dtypes.
TEST(ProfilerTables, SixteenBitRowsUseTheBf16Ceiling) {
  profiler::Ceilings c;
  c.gemm_gflops = 100;
  c.gemm_bf16_gflops = 400;
  c.copy_gbs = 10;
  profiler::OpRecord f32{.name = "matmul", .phase = "forward", .backend = "cpu", .dtype = "f32"};
  f32.calls = 1;
  f32.self_ns = f32.total_ns = 20'000'000;  // 1e9 FLOPs: 10 ms at the roof
  f32.flops = 1e9;
  f32.bytes = 1e6;
  profiler::OpRecord bf16 = f32;
  bf16.name = "linear";
  bf16.dtype = "bf16";  // 2.5 ms at the roof
  const auto rows = profiler::op_table({f32, bf16}, {.basis_ns = 4e7}, c, {});
  ASSERT_EQ(rows.size(), 2u);
  for (const profiler::TableRow& r : rows) {
    EXPECT_EQ(r.bound, "compute") << r.key;
    EXPECT_DOUBLE_EQ(r.roof_pct, r.key == "matmul" ? 0.5 : 0.125) << r.key;
  }
}

// ---- memory -----------------------------------------------------------------------------------

TEST(ProfilerMemory, PeakIsNamedAtTheOpThatAllocatedIt) {
  const Tensor a = Tensor::randn({16, 16});
  profiler::start_session({.telemetry_ms = 0});
  profiler::step_begin(0);
  (void)add(a, a);
  {
    profiler::ScopeGuard scope("big.layer");
    profiler::OpScope op("big_temporary", Backend::reference, {}, [] { return OpCost{}; });
    Tensor tmp = Tensor::empty({16 * 1024 * 1024});  // 64 MiB, freed before the op ends
  }
  (void)add(a, a);
  profiler::step_end();
  profiler::stop_session();
  const json r = profiler::build_report(profiler::capture(), json::object(), {.use_probe = false});
  const json& cpu = r["memory"]["devices"][0];
  EXPECT_EQ(cpu["device"], "cpu");
  ASSERT_TRUE(cpu["peak_op"].is_object()) << cpu.dump();
  EXPECT_EQ(cpu["peak_op"]["name"], "big_temporary");
  EXPECT_EQ(cpu["peak_op"]["scope"], "big.layer");
  EXPECT_EQ(cpu["peak_op"]["step"], 0);
  EXPECT_GE(cpu["peak"].get<int64_t>(), int64_t{64} * 1024 * 1024);
  EXPECT_EQ(cpu["peak_op"]["bytes_allocated"], int64_t{64} * 1024 * 1024);
  EXPECT_EQ(cpu["peak_note"], "");
  // The step end recorded the per-tag bytes.
  EXPECT_TRUE(r["steps"][0]["memory"][0]["by_tag"].contains("activation"));
  const json& proc = r["memory"]["process"];
  EXPECT_TRUE(proc["rss_bytes"].is_number());
  EXPECT_TRUE(proc["hwm_bytes"].is_number());
  EXPECT_NE(profiler::format_memory(r).find("peak reached at op #"), std::string::npos);
  profiler::clear();
}

// Ops open their window before allocating their outputs, so every op counts at least its
// outputs' bytes (workspace comes on top), forward and backward.
TEST(ProfilerMemory, OpsCountTheirOutputsAsAllocated) {
  const Tensor x = Tensor::randn({2, 3, 8, 8}).set_requires_grad(true);
  const Tensor w = Tensor::randn({4, 3, 3, 3}).set_requires_grad(true);
  const Tensor g = Tensor::ones({4}).set_requires_grad(true), b = Tensor::zeros({4}).set_requires_grad(true);
  const Tensor nhwc = Tensor::randn({2, 3, 8, 8}).contiguous(MemoryFormat::channels_last);
  Tensor y;
  auto ev = record([&] {
    y = conv2d(x, w, Tensor(), {.pad_h = 1, .pad_w = 1});
    Tensor h = relu(batch_norm(y, g, b, Tensor(), Tensor(), {}));
    sum(h).backward();
    (void)Tensor::zeros({100});
    (void)Tensor::randn({50});
    (void)nhwc.contiguous();
    (void)matmul(Tensor::ones({5, 7}), Tensor::ones({7, 3}));
  });
  const int64_t f = 4;  // bytes per f32
  EXPECT_GE(find(ev, "conv2d").bytes_allocated, 2 * 4 * 8 * 8 * f);       // y
  EXPECT_GE(find(ev, "batch_norm").bytes_allocated, (2 * 4 * 8 * 8 + 2 * 4) * f);  // y, saved mean and invstd
  EXPECT_GE(find(ev, "relu").bytes_allocated, 2 * 4 * 8 * 8 * f);
  EXPECT_GE(find(ev, "sum").bytes_allocated, f);
  EXPECT_GE(find(ev, "relu.backward").bytes_allocated, 2 * 4 * 8 * 8 * f);
  EXPECT_GE(find(ev, "batch_norm.backward").bytes_allocated, (2 * 4 * 8 * 8 + 2 * 4) * f);  // dx, dgamma, dbeta
  // dx and dw, allocated in the window of the one backward op whose outputs they are (its passes,
  // conv2d.backward_data and conv2d.backward_weight, are windows inside it).
  EXPECT_GE(find(ev, "conv2d.backward").bytes_allocated, (2 * 3 * 8 * 8 + 4 * 3 * 3 * 3) * f);
  EXPECT_GE(find(ev, "matmul").bytes_allocated, 5 * 3 * f);
  EXPECT_GE(find(ev, "randn").bytes_allocated, 50 * f);
  int64_t fills = 0, copies = 0;
  for (const OpEvent& e : ev) {
    if (std::string(e.name) == "fill" && e.shapes == "[100]") fills = e.bytes_allocated;
    if (std::string(e.name) == "copy" && e.shapes == "[2, 3, 8, 8]") copies = std::max(copies, e.bytes_allocated);
  }
  EXPECT_GE(fills, 100 * f);   // zeros: the new tensor is the fill's
  EXPECT_GE(copies, 2 * 3 * 8 * 8 * f);  // contiguous(): the new tensor is the copy's
  EXPECT_EQ(find(ev, "randn").shapes, "[50]");  // a creation op is described by its output
}

// Another thread's allocations (a loader worker's) do not count against the op running here.
TEST(ProfilerMemory, AllocationsOfOtherThreadsAreNotTheOps) {
  auto ev = record([&] {
    profiler::OpScope op("waits", Backend::reference, {}, [] { return OpCost{}; });
    std::thread([] { Tensor t = Tensor::empty({1 << 18}); }).join();
  });
  ASSERT_EQ(ev.size(), 1u);
  EXPECT_EQ(ev[0].bytes_allocated, 0);
}

// The peak is named at the op whose output made it: mul's 16 MiB outer product here, freed
// before the next ops run (an op that allocated while it was alive would be the new peak).
TEST(ProfilerMemory, PeakSiteIsTheOpWhoseOutputMadeIt) {
  const Tensor col = Tensor::randn({2048, 1}), row = Tensor::randn({1, 2048});
  profiler::start_session({.telemetry_ms = 0});
  profiler::step_begin(0);
  (void)relu(col);
  {
    profiler::ScopeGuard scope("outer");
    (void)mul(col, row);  // [2048, 2048] f32: 16 MiB, freed at once
  }
  (void)add(col, col);
  (void)relu(col);
  profiler::step_end();
  profiler::stop_session();
  const json r = profiler::build_report(profiler::capture(), json::object(), {.use_probe = false});
  const json& cpu = r["memory"]["devices"][0];
  ASSERT_TRUE(cpu["peak_op"].is_object()) << cpu.dump();
  EXPECT_EQ(cpu["peak_op"]["name"], "mul");
  EXPECT_EQ(cpu["peak_op"]["scope"], "outer");
  EXPECT_EQ(cpu["peak_op"]["inside"], true);
  EXPECT_GE(cpu["peak_op"]["bytes_allocated"].get<int64_t>(), int64_t{16} << 20);
  EXPECT_EQ(cpu["peak_note"], "");
  const std::string text = profiler::format_memory(r);
  EXPECT_NE(text.find("peak reached at op #"), std::string::npos) << text;
  EXPECT_NE(text.find("mul (other, outer, [2048, 1] [1, 2048]) in step 0"), std::string::npos) << text;
  EXPECT_NE(text.find("16.0 MiB allocated by it"), std::string::npos) << text;
  profiler::clear();
}

// A peak made between ops (a raw allocation no op owns) is not pinned on the next op: it is the
// op the peak was first seen at, marked as not inside it, with a note.
TEST(ProfilerMemory, PeakBetweenOpsIsSaidToBeOutsideThem) {
  const Tensor a = Tensor::randn({16});
  profiler::start_session({.telemetry_ms = 0});
  (void)add(a, a);
  { Tensor raw = Tensor::empty({4 << 20}); }  // 16 MiB by no op, freed before the next one
  (void)add(a, a);
  profiler::stop_session();
  const json r = profiler::build_report(profiler::capture(), json::object(), {.use_probe = false});
  const json& cpu = r["memory"]["devices"][0];
  ASSERT_TRUE(cpu["peak_op"].is_object()) << cpu.dump();
  EXPECT_EQ(cpu["peak_op"]["index"], 1);
  EXPECT_EQ(cpu["peak_op"]["inside"], false);
  EXPECT_NE(cpu["peak_note"].get<std::string>().find("already reached when op #1 add started"), std::string::npos)
      << cpu["peak_note"];
  EXPECT_NE(profiler::format_memory(r).find("peak reached before op #1 add"), std::string::npos);
  profiler::clear();
}

// ---- trace ------------------------------------------------------------------------------------

TEST(ProfilerTrace, EveryEventHasTheRequiredFields) {
  Tensor a = Tensor::randn({32, 32});
  profiler::start_session({.telemetry_ms = 1});
  profiler::set_thread_name("test main");
  for (int s = 0; s < 2; ++s) {
    profiler::step_begin(s, 1);
    profiler::PhaseGuard fwd(Phase::forward);
    (void)relu(matmul(a, a));
    profiler::step_end();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  profiler::stop_session();
  TempDir dir;
  const std::string path = dir.file("trace.json");
  profiler::write_chrome_trace(profiler::capture(), path);
  const json t = json::parse(profiler::read_file(path, "trace"));
  ASSERT_TRUE(t["traceEvents"].is_array());
  int x = 0, c = 0, m = 0, steps = 0, phases = 0;
  for (const auto& e : t["traceEvents"]) {
    for (const char* k : {"name", "ph", "ts", "pid", "tid"}) ASSERT_TRUE(e.contains(k)) << k << " missing in " << e.dump();
    ASSERT_TRUE(e["ts"].is_number());
    const std::string ph = e["ph"];
    if (ph == "X") {
      ++x;
      ASSERT_TRUE(e.contains("dur") && e["dur"].is_number()) << e.dump();
      EXPECT_GE(e["dur"].get<double>(), 0);
      EXPECT_GE(e["ts"].get<double>(), 0);
      if (e.value("cat", "") == "step") ++steps;
      if (e.value("cat", "") == "phase") ++phases;
    } else if (ph == "C") {
      ++c;
      ASSERT_TRUE(e["args"].is_object());
    } else if (ph == "M") {
      ++m;
    } else {
      ADD_FAILURE() << "unexpected phase type " << ph;
    }
  }
  EXPECT_EQ(steps, 2);
  EXPECT_GE(phases, 2);
  EXPECT_GE(x, 2 + 4);  // steps + 2 x (matmul, relu)
  EXPECT_GT(c, 0);
  EXPECT_GT(m, 0);
  EXPECT_NE(t.dump().find("test main"), std::string::npos);
  profiler::clear();
}

// A collective's window names the transport that carried it where an op names its backend: in the
// op records (so in every table of the report) and in the trace.
TEST(ProfilerTrace, CommunicationShowsItsTransportAsTheBackend) {
  Tensor a = Tensor::randn({8, 8});
  profiler::start_session({.telemetry_ms = 0});
  profiler::step_begin(0, 1);
  {
    profiler::PhaseGuard fwd(Phase::forward);
    (void)relu(a);
  }
  {
    profiler::PhaseGuard comm(Phase::comm);
    profiler::CommScope op("comm.all_reduce", "mpi", {&a}, [] { return OpCost{0.0, 512.0}; });
  }
  profiler::step_end();
  profiler::stop_session();
  const profiler::Capture cap = profiler::capture();
  std::map<std::string, std::string> backend_of;
  const json report = profiler::build_report(cap, json::object());
  for (const auto& rec : report["op_records"])
    backend_of[rec["name"].get<std::string>()] = rec["backend"].get<std::string>();
  EXPECT_EQ(backend_of["comm.all_reduce"], "mpi");
  EXPECT_EQ(backend_of["relu"], backend_name(a.backend()));
  int comm_events = 0;
  const json trace = profiler::chrome_trace(cap);
  for (const auto& e : trace["traceEvents"])
    if (e.value("name", "") == "comm.all_reduce") {
      ++comm_events;
      EXPECT_EQ(e["args"]["backend"], "mpi") << e.dump();
    }
  EXPECT_EQ(comm_events, 1);
  profiler::clear();
}

// ---- JSON report, load errors, compare --------------------------------------------------------

TEST(ProfilerReport, RoundTripsThroughAFile) {
  const json r = small_training_report();
  TempDir dir;
  const std::string path = dir.file("sub/run.json");  // the folder is created
  profiler::write_report(r, path, dir.file("sub/run.ops.csv"));
  const json back = profiler::load_report(path);
  EXPECT_EQ(back["op_records"].size(), r["op_records"].size());
  EXPECT_EQ(profiler::format_report(back, {}), profiler::format_report(r, {}));
  for (const auto& entry : fs::directory_iterator(dir.path / "sub"))
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << "temporary file left: " << entry.path();
  EXPECT_TRUE(fs::exists(dir.file("sub/run.ops.csv")));
  EXPECT_TRUE(r["telemetry"].is_object());
  EXPECT_EQ(r["roofline"]["probe"], nullptr);
}

void expect_error(const std::string& path, const std::string& fragment) {
  try {
    profiler::load_report(path);
    ADD_FAILURE() << "expected duet::Error for " << path;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "the message names the file: " << e.what();
  }
}

TEST(ProfilerReport, BadFilesGiveClearErrors) {
  TempDir dir;
  expect_error(dir.file("missing.json"), "does not exist");
  write_text(dir.file("broken.json"), "{\"schema\": \"duet.profile/1\", ");
  expect_error(dir.file("broken.json"), "not valid JSON");
  write_text(dir.file("other.json"), R"({"schema": "duet.profile/2"})");
  expect_error(dir.file("other.json"), "has schema 'duet.profile/2': this duet reads 'duet.profile/1'");
  write_text(dir.file("noschema.json"), R"({"ops": []})");
  expect_error(dir.file("noschema.json"), "not a duet profile report");
  json r = small_training_report(1);
  r.erase("phases");
  write_text(dir.file("nophases.json"), r.dump());
  expect_error(dir.file("nophases.json"), "lacks its \"phases\" section");
  r = small_training_report(1);
  r["op_records"][0].erase("self_ns");
  write_text(dir.file("badrec.json"), r.dump());
  expect_error(dir.file("badrec.json"), "lacks field 'self_ns'");
  expect_error(dir.path.string(), "is a folder");
  write_text(dir.file("empty.json"), "");
  expect_error(dir.file("empty.json"), "not valid JSON");
  write_text(dir.file("array.json"), "[1, 2]");
  expect_error(dir.file("array.json"), "is a JSON array, expected an object");
  write_text(dir.file("sweep.json"), R"({"schema": "duet.sweep/1", "points": []})");
  expect_error(dir.file("sweep.json"), "has schema 'duet.sweep/1': this duet reads 'duet.profile/1'");
  r = small_training_report(1);
  r["memory"]["devices"][0]["current"] = "lots";
  write_text(dir.file("badmem.json"), r.dump());
  expect_error(dir.file("badmem.json"), "its \"memory\" section has a field missing or of the wrong type");
  r = small_training_report(1);
  r["totals"].erase("device");
  write_text(dir.file("nodevice.json"), r.dump());
  expect_error(dir.file("nodevice.json"), "totals.device is null");
}

// duet.sweep/1 documents (the throughput plot's input) are checked as strictly as reports.
TEST(ProfilerSweep, BadSweepDocumentsGiveClearErrors) {
  auto message = [](const json& j) {
    try {
      (void)profiler::sweep_points_from_json(j);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(json::array()).find("not a sweep document"), std::string::npos);
  EXPECT_NE(message({{"schema", 1}}).find("not a sweep document"), std::string::npos);
  EXPECT_NE(message({{"schema", "duet.sweep/1"}}).find("lacks its \"points\" array"), std::string::npos);
  EXPECT_NE(message({{"schema", "duet.sweep/1"}, {"points", {3}}}).find("point 0 is a JSON number"), std::string::npos);
  const json no_batch = {{"schema", "duet.sweep/1"}, {"points", {{{"batch", "16"}, {"steps", 3}}}}};
  EXPECT_NE(message(no_batch).find("point 0 lacks an integer \"batch\""), std::string::npos);
  const json odd = {{"schema", "duet.sweep/1"},
                    {"points", {{{"batch", 16}, {"steps", 3}, {"images_per_s", "fast"}, {"error", 7}}}}};
  const auto pts = profiler::sweep_points_from_json(odd);  // optional fields of the wrong type are absent
  ASSERT_EQ(pts.size(), 1u);
  EXPECT_FALSE(pts[0].images_per_s);
  EXPECT_TRUE(pts[0].error.empty());
}

// Every path in a report (first element of each array), for the mutation test below.
void json_paths(const json& j, const json::json_pointer& at, std::vector<json::json_pointer>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      out.push_back(at / it.key());
      json_paths(it.value(), at / it.key(), out);
    }
  } else if (j.is_array() && !j.empty()) {
    out.push_back(at / 0);
    json_paths(j[0], at / 0, out);
  }
}

// A report that is valid JSON with the right schema but a field removed or of the wrong type
// (hand-edited, truncated by another tool, written by a buggy script) is a duet::Error naming
// the report, or reads fine; never another exception, never a crash. Every reader is exercised:
// the text views, the CSV, compare in both positions.
TEST(ProfilerReport, AnyFieldMissingOrOfTheWrongTypeIsAClearError) {
  const json good = small_training_report(2);
  std::vector<json::json_pointer> paths;
  json_paths(good, json::json_pointer(), paths);
  ASSERT_GT(paths.size(), 100u);
  const std::vector<json> bad = {nullptr, "x", json::array(), json::object(), -1, true};
  int errors = 0, fine = 0;
  for (const auto& p : paths) {
    for (size_t v = 0; v <= bad.size(); ++v) {
      json r = good;
      if (v == bad.size()) {
        const json::json_pointer parent = p.parent_pointer();
        if (r.at(parent).is_object()) r.at(parent).erase(p.back());
        else r.at(parent).erase(0);
      } else {
        r.at(p) = bad[v];
      }
      const std::string what = p.to_string() + (v == bad.size() ? " removed" : " = " + bad[v].dump());
      try {
        profiler::validate_report(r, "mutated.json");
        profiler::PrintOptions all;
        all.layers = all.per_step = true;
        (void)profiler::format_report(r, all);
        (void)profiler::report_csv(r, {});
        for (const json& cmp : {profiler::compare({{"good", good}, {"mutated.json", r}}),
                                profiler::compare({{"mutated.json", r}, {"good", good}})})
          (void)profiler::format_compare(cmp);
        ++fine;
      } catch (const Error& e) {
        ++errors;
        EXPECT_NE(std::string(e.what()).find("mutated.json"), std::string::npos) << what << ": " << e.what();
      } catch (const std::exception& e) {
        ADD_FAILURE() << what << ": not a duet::Error: " << e.what();
      }
    }
  }
  EXPECT_GT(errors, 0);
  EXPECT_GT(fine, 0);
}

TEST(ProfilerCompare, AReportAgainstItselfHasRatiosOfOne) {
  const json r = small_training_report();
  const json cmp = profiler::compare({profiler::NamedReport{"a", r}, profiler::NamedReport{"b", r}});
  EXPECT_TRUE(cmp["warnings"].empty()) << cmp["warnings"].dump();
  ASSERT_FALSE(cmp["ops"].empty());
  for (const char* section : {"ops", "phases", "layers"})
    for (const auto& row : cmp[section]) {
      if (row["ratio"][0].is_null()) continue;  // a zero in the baseline has no ratio
      EXPECT_DOUBLE_EQ(row["ratio"][1].get<double>(), 1.0) << row.dump();
    }
  EXPECT_TRUE(cmp["share_shifts"].empty());
  const std::string text = profiler::format_compare(cmp);
  EXPECT_NE(text.find("1.00x"), std::string::npos) << text;
}

TEST(ProfilerCompare, DifferentModelsWarnAndSkipLayers) {
  const json a = small_training_report();
  json b = a;
  b["run_config"]["model"] = "other";
  const json cmp = profiler::compare({profiler::NamedReport{"a", a}, profiler::NamedReport{"b", b}});
  ASSERT_EQ(cmp["warnings"].size(), 1u);
  EXPECT_NE(cmp["warnings"][0].get<std::string>().find("different models (tiny vs other)"), std::string::npos);
  EXPECT_TRUE(cmp["layers"].is_null());
  EXPECT_FALSE(cmp["ops"].empty());
  const std::string text = profiler::format_compare(cmp);
  EXPECT_EQ(text.rfind("WARNING: the reports are of different models", 0), 0u) << text;
  EXPECT_NE(text.find("layers: skipped"), std::string::npos);
}

TEST(ProfilerCompare, ThroughputReportsHaveNoOpTimesNotZeroes) {
  const json per_op = small_training_report(2);
  const json tp = small_training_report(2, TimingMode::throughput);
  const json cmp = profiler::compare({profiler::NamedReport{"per-op", per_op}, profiler::NamedReport{"tp", tp}});
  ASSERT_EQ(cmp["warnings"].size(), 1u);
  EXPECT_NE(cmp["warnings"][0].get<std::string>().find("mix timing modes"), std::string::npos);
  for (const auto& row : cmp["ops"]) {
    EXPECT_TRUE(row["value"][1].is_null()) << row.dump();
    EXPECT_TRUE(row["ratio"][1].is_null()) << row.dump();
  }
  bool wall = false;
  for (const auto& row : cmp["phases"])
    if (row["phase"] == "forward (wall)") {
      wall = true;
      EXPECT_TRUE(row["ratio"][1].is_number());
    }
  EXPECT_TRUE(wall) << cmp["phases"].dump();
}

TEST(ProfilerCompare, NeedsTwoReportsAndValidFiles) {
  EXPECT_THROW(profiler::compare({profiler::NamedReport{"a", small_training_report(1)}}), Error);
  TempDir dir;
  write_text(dir.file("ok.json"), small_training_report(1).dump());
  try {
    profiler::compare_files({dir.file("ok.json"), dir.file("nope.json")});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nope.json' does not exist"), std::string::npos) << e.what();
  }
  // A report of another schema version is refused by name, in either position.
  write_text(dir.file("v2.json"), R"({"schema": "duet.profile/2", "phases": {}})");
  for (const auto& files : {std::vector<std::string>{dir.file("ok.json"), dir.file("v2.json")},
                            std::vector<std::string>{dir.file("v2.json"), dir.file("ok.json")}}) {
    try {
      profiler::compare_files(files);
      ADD_FAILURE() << "a duet.profile/2 report was compared";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("v2.json' has schema 'duet.profile/2'"), std::string::npos) << e.what();
    }
  }
}

// ---- probe ------------------------------------------------------------------------------------

TEST(ProfilerProbe, MeasuresSavesAndIsFoundForTheSameMachine) {
  TempDir dir;
  ::setenv("DUET_CACHE_DIR", dir.path.c_str(), 1);
  const profiler::ProbeResult p = profiler::run_probe({.gemm_size = 64, .copy_mib = 1, .threads = {1}, .repeats = 1});
  ASSERT_EQ(p.points.size(), 1u);
  EXPECT_GT(p.points[0].gemm_gflops, 0);
  EXPECT_GT(p.points[0].copy_gbs, 0);
  // bf16 is measured wherever the cpu backend has oneDNN's bf16 kernels (AVX-512), which the machine
  // record says, and 0 elsewhere (a build without oneDNN probes the reference loops).
  const bool onednn_bf16 = p.machine.value("cpu_bf16", std::string()) == "onednn";
  EXPECT_EQ(p.points[0].gemm_bf16_gflops > 0, onednn_bf16 && p.backend == "cpu") << p.backend << " " << p.machine.dump();
  EXPECT_FALSE(profiler::enabled());
  const std::string path = profiler::default_probe_path(p.machine);
  EXPECT_EQ(fs::path(path).parent_path(), dir.path);
  EXPECT_EQ(fs::path(path).filename().string().rfind("probe-", 0), 0u);
  std::string why;
  EXPECT_FALSE(profiler::find_ceilings(p.machine, "cpu", 1, "", &why));
  EXPECT_NE(why.find("no probe"), std::string::npos);
  profiler::save_probe(p, path);
  const auto c = profiler::find_ceilings(p.machine, "cpu", 1, "", &why);
  ASSERT_TRUE(c);
  EXPECT_DOUBLE_EQ(c->gemm_gflops, p.points[0].gemm_gflops);
  EXPECT_DOUBLE_EQ(c->gemm_bf16_gflops, p.points[0].gemm_bf16_gflops);
  EXPECT_EQ(c->probe_path, path);
  // Another CPU model does not match.
  json other = p.machine;
  other["cpu_model"] = "Some Other CPU";
  EXPECT_FALSE(profiler::find_ceilings(other, "cpu", 1, "", &why));
  // Nor does another generation under the same model name (a VM's "AMD EPYC" on Zen 4 and Zen 5).
  json other_generation = p.machine;
  other_generation["cpu_family"] = p.machine.value("cpu_family", std::string()) == "25" ? "26" : "25";
  EXPECT_FALSE(profiler::find_ceilings(other_generation, "cpu", 1, "", &why));
  EXPECT_NE(why.find("no probe"), std::string::npos) << why;
  // Reports pick it up and fill the bound column.
  const json r = small_training_report(1);
  const json r2 = profiler::build_report(profiler::capture(), json::object());
  EXPECT_TRUE(r2["roofline"]["probe"].is_string()) << r2["roofline"].dump();
  write_text(dir.file("probe-broken.json"), "not json");  // ignored in the scan
  EXPECT_TRUE(profiler::find_ceilings(p.machine, "cpu", 2, "", &why));
  EXPECT_THROW(profiler::find_ceilings(p.machine, "cpu", 1, dir.file("probe-broken.json"), &why), Error);
  ::unsetenv("DUET_CACHE_DIR");
  (void)r;
}

// ---- telemetry --------------------------------------------------------------------------------

class AbsentSource final : public profiler::TelemetrySource {
public:
  std::string name() const override { return "fake-gpu"; }
  std::vector<profiler::Reading> read() override { return {{"gpu0.util_pct", "%", std::nullopt}}; }
};

TEST(ProfilerTelemetry, AbsentReadingsAreNullNotZero) {
  std::vector<std::unique_ptr<profiler::TelemetrySource>> extra;
  extra.push_back(std::make_unique<AbsentSource>());
  profiler::TelemetrySampler s(1, std::move(extra));
  s.start();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.stop();
  const profiler::TelemetryLog log = s.log();
  ASSERT_GE(log.samples.size(), 2u);
  size_t gpu = log.channels.size(), cpu = log.channels.size();
  for (size_t i = 0; i < log.channels.size(); ++i) {
    if (log.channels[i].name == "gpu0.util_pct") gpu = i;
    if (log.channels[i].name == "process_cpu_pct") cpu = i;
  }
  ASSERT_LT(gpu, log.channels.size());
  ASSERT_LT(cpu, log.channels.size());
  EXPECT_FALSE(log.samples[0].values[cpu]) << "a rate needs two readings";
  EXPECT_TRUE(log.samples.back().values[cpu]);
  for (const auto& smp : log.samples) EXPECT_FALSE(smp.values[gpu]);
}

// CPU temperature and power from a fake sysfs tree: the CPU's hwmon sensor (not the disk's), the
// package's RAPL energy counter (not its sub-domain) as a rate; no source at all without them.
TEST(ProfilerTelemetry, CpuSensorsFromSysfs) {
  TempDir dir;
  EXPECT_EQ(profiler::make_cpu_sensor_source(dir.path.string()), nullptr) << "nothing exposed: no channels";
  const fs::path hw = dir.path / "class/hwmon", rapl = dir.path / "class/powercap";
  fs::create_directories(hw / "hwmon0");
  fs::create_directories(hw / "hwmon1");
  fs::create_directories(rapl / "intel-rapl:0");
  fs::create_directories(rapl / "intel-rapl:0:0");
  write_text((hw / "hwmon0/name").string(), "nvme\n");
  write_text((hw / "hwmon0/temp1_input").string(), "90000\n");
  write_text((hw / "hwmon1/name").string(), "k10temp\n");
  write_text((hw / "hwmon1/temp1_input").string(), "51250\n");
  write_text((hw / "hwmon1/temp3_input").string(), "48000\n");
  write_text((rapl / "intel-rapl:0/energy_uj").string(), "1000000\n");
  write_text((rapl / "intel-rapl:0/max_energy_range_uj").string(), "262143328850\n");
  write_text((rapl / "intel-rapl:0:0/energy_uj").string(), "999999999\n");
  auto src = profiler::make_cpu_sensor_source(dir.path.string());
  ASSERT_NE(src, nullptr);
  auto first = src->read();
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].name, "cpu_temperature_c");
  ASSERT_TRUE(first[0].value);
  EXPECT_DOUBLE_EQ(*first[0].value, 51.25) << "the hottest CPU sensor, the disk's ignored";
  EXPECT_EQ(first[1].name, "cpu_power_w");
  EXPECT_FALSE(first[1].value) << "a rate needs two readings";
  const auto t0 = std::chrono::steady_clock::now();
  write_text((rapl / "intel-rapl:0/energy_uj").string(), "3000000\n");  // 2 J later
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto second = src->read();
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(second[1].value);
  EXPECT_GT(*second[1].value, 0.0);
  EXPECT_LE(*second[1].value, 2.0 / 0.05 + 1e-9) << "2 J over at least 50 ms";
  EXPECT_GE(*second[1].value, 2.0 / (elapsed + 1.0)) << "2 J over about " << elapsed << " s";
  // Only a thermal zone typed as the CPU's counts when there is no CPU hwmon driver.
  TempDir zones;
  fs::create_directories(zones.path / "class/thermal/thermal_zone0");
  fs::create_directories(zones.path / "class/thermal/thermal_zone1");
  write_text((zones.path / "class/thermal/thermal_zone0/type").string(), "acpitz\n");
  write_text((zones.path / "class/thermal/thermal_zone0/temp").string(), "27800\n");
  write_text((zones.path / "class/thermal/thermal_zone1/type").string(), "x86_pkg_temp\n");
  write_text((zones.path / "class/thermal/thermal_zone1/temp").string(), "44000\n");
  auto zsrc = profiler::make_cpu_sensor_source(zones.path.string());
  ASSERT_NE(zsrc, nullptr);
  const auto z = zsrc->read();
  ASSERT_EQ(z.size(), 1u) << "no RAPL counter: no power channel";
  ASSERT_TRUE(z[0].value);
  EXPECT_DOUBLE_EQ(*z[0].value, 44.0);
}

// ---- sweeps, files, formatting ----------------------------------------------------------------

TEST(ProfilerSweep, BatchListsAndTable) {
  EXPECT_EQ(profiler::parse_batch_list("16,32,64"), (std::vector<int64_t>{16, 32, 64}));
  EXPECT_THROW(profiler::parse_batch_list("16,,64"), Error);
  EXPECT_THROW(profiler::parse_batch_list("16,x"), Error);
  EXPECT_THROW(profiler::parse_batch_list("0"), Error);
  const json r = small_training_report(2);
  std::vector<profiler::SweepPoint> pts{profiler::sweep_point_from_report(4, r)};
  profiler::SweepPoint failed;
  failed.batch = 4096;
  failed.error = "out of memory";
  pts.push_back(failed);
  const json j = profiler::sweep_json({{"model", "tiny"}}, pts);
  const auto back = profiler::sweep_points_from_json(j);
  ASSERT_EQ(back.size(), 2u);
  EXPECT_TRUE(back[0].images_per_s);
  EXPECT_FALSE(back[1].images_per_s);
  EXPECT_TRUE(j["points"][1]["images_per_s"].is_null());
  const std::string t = profiler::format_sweep_table(back);
  EXPECT_NE(t.find("out of memory"), std::string::npos) << t;
}

// ---- plots ------------------------------------------------------------------------------------

std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// scripts/plot_profile.py on small generated reports and a sweep: every plot is a PNG, and bad
// input is a message and a non-zero exit. Needs /usr/bin/python3 (or $DUET_PLOT_PYTHON) with
// Debian's matplotlib; skips, saying so, without it.
TEST(ProfilerPlots, ScriptDrawsEveryPlotAndRefusesBadInput) {
  const char* env = std::getenv("DUET_PLOT_PYTHON");  // another interpreter to try, or one that is absent
  const std::string python = env ? env : "/usr/bin/python3";
  if (std::system((python + " -c 'import matplotlib' > /dev/null 2>&1").c_str()) != 0)
    GTEST_SKIP() << python << " with matplotlib not found (Debian: apt-get install python3-matplotlib): "
                 << "scripts/plot_profile.py not run";
  const std::string script = std::string(DUET_SOURCE_DIR) + "/scripts/plot_profile.py";
  ASSERT_TRUE(fs::exists(script)) << script;
  TempDir dir;
  json r = small_training_report(3);
  r["roofline"] = {{"probe", "probe-test.json"}, {"note", ""}, {"created", "2026-01-01T00:00:00Z"}, {"device", "cpu"},
                   {"backend", "cpu"}, {"threads", 1}, {"gemm_gflops", 100.0}, {"copy_gbs", 10.0},
                   {"ridge_flop_per_byte", 10.0}};
  profiler::write_report(r, dir.file("run.json"));
  profiler::write_report(small_training_report(2, TimingMode::throughput), dir.file("tp.json"));
  std::vector<profiler::SweepPoint> pts;
  for (int64_t b : {4, 8, 16}) pts.push_back(profiler::sweep_point_from_report(b, r));
  profiler::SweepPoint failed;
  failed.batch = 32;
  failed.error = "out of memory";
  pts.push_back(failed);
  profiler::write_file_atomic(dir.file("sweep.json"), profiler::sweep_json({{"model", "tiny"}}, pts).dump());
  auto run = [&](const std::string& args) {
    const std::string log = dir.file("log.txt");
    const int rc = std::system((python + " " + script + " " + args + " > " + log + " 2>&1").c_str());
    return std::make_pair(rc, slurp(log));
  };
  const auto [rc, log] = run(dir.file("run.json") + " --sweep " + dir.file("sweep.json") + " --out " + dir.file("plots"));
  ASSERT_EQ(rc, 0) << log;
  for (const char* png : {"run.roofline.png", "run.top_ops.png", "run.steps.png", "sweep.throughput.png"}) {
    const std::string bytes = slurp(dir.file(std::string("plots/") + png));
    EXPECT_GT(bytes.size(), 1000u) << png;
    EXPECT_EQ(bytes.substr(0, 4), "\x89PNG") << png;
    EXPECT_NE(log.find(png), std::string::npos) << log;
  }
  // A throughput report has no op table: only the step plot, and a line that says why.
  const auto [rc_tp, log_tp] = run(dir.file("tp.json") + " --out " + dir.file("plots"));
  EXPECT_EQ(rc_tp, 0) << log_tp;
  EXPECT_NE(log_tp.find("no op table (throughput mode)"), std::string::npos) << log_tp;
  EXPECT_TRUE(fs::exists(dir.file("plots/tp.steps.png")));
  EXPECT_FALSE(fs::exists(dir.file("plots/tp.roofline.png")));
  // Bad input: a clear message, a non-zero exit, no traceback.
  write_text(dir.file("v2.json"), R"({"schema": "duet.profile/2"})");
  write_text(dir.file("broken.json"), "{");
  json odd = r;
  odd["op_table"][0]["flops"] = "many";
  write_text(dir.file("odd.json"), odd.dump());
  const std::pair<std::string, std::string> bad[] = {
      {dir.file("odd.json"), "a field is missing or of the wrong type"},
      {dir.file("missing.json"), "does not exist"},
      {dir.file("v2.json"), "has schema 'duet.profile/2', expected 'duet.profile/1'"},
      {dir.file("broken.json"), "is not valid JSON"},
      {"--sweep " + dir.file("run.json"), "has schema 'duet.profile/1', expected 'duet.sweep/1'"},
  };
  for (const auto& [args, message] : bad) {
    const auto [rc_bad, log_bad] = run(args + " --out " + dir.file("plots"));
    EXPECT_NE(rc_bad, 0) << args;
    EXPECT_NE(log_bad.find(message), std::string::npos) << args << ": " << log_bad;
    EXPECT_EQ(log_bad.find("Traceback"), std::string::npos) << args << ": " << log_bad;
  }
}

TEST(ProfilerFiles, AtomicWriteReplacesWholeFiles) {
  TempDir dir;
  const std::string p = dir.file("a/b/c.txt");
  profiler::write_file_atomic(p, "first");
  profiler::write_file_atomic(p, "second");
  EXPECT_EQ(profiler::read_file(p, "file"), "second");
  EXPECT_EQ(profiler::csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(profiler::csv_field("say \"x\""), "\"say \"\"x\"\"\"");
}

TEST(ProfilerOverhead, OffModeRecordsNothing) {
  profiler::clear();
  ASSERT_FALSE(profiler::recording());
  const Tensor a = Tensor::randn({4});
  profiler::step_begin(0);
  (void)add(a, a);
  profiler::step_end();
  EXPECT_TRUE(profiler::collect().empty());
  EXPECT_TRUE(profiler::collect_steps().empty());
  EXPECT_TRUE(profiler::collect_phase_marks().empty());
}

}  // namespace
}  // namespace duet
