// What the profiler costs.
// - Per dispatched op: add of two 16-element tensors (the kernel itself is a few ns, so the
//   numbers are dispatch + profiler overhead) with profiling off, in per-op mode, and in
//   throughput mode (steps only); a pair of step markers.
// - Per training step: SGD steps of resnet18_cifar at width 0.25, batch 32, 32x32 images, on the
//   CPU backend, with step markers and phases as the trainer sets them. BM_TrainStep/<mode> times
//   each mode on its own; BM_TrainStepInterleaved runs off, per-op and throughput steps in turn
//   (so a change of machine load hits all three alike) and reports the median step time of each
//   mode and, as the overhead counters (per_op_overhead_pct, throughput_overhead_pct), the median
//   over rounds of each mode's step time over the off step's of the same round, minus 1
//   (per_op_cpu_overhead_pct: the same on the calling thread's CPU time).
// Run:
//   build/bench/duet_bench_profiler --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   build/bench/duet_bench_profiler --benchmark_filter=TrainStepInterleaved --benchmark_min_time=30
#include <benchmark/benchmark.h>
#include <time.h>
#include <algorithm>
#include <memory>
#include <vector>
#include "engine/duet.h"
#include "engine/nn/module.h"
#include "engine/optim/optimizer.h"
#include "models/registry.h"

namespace {

using namespace duet;

void run_add(benchmark::State& state) {
  const Tensor a = Tensor::randn({16}), b = Tensor::randn({16});
  for (auto _ : state) {
    Tensor c = add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
  }
}

void BM_AddProfilerOff(benchmark::State& state) {
  profiler::enable(false);
  profiler::enable_throughput(false);
  run_add(state);
}

void BM_AddProfilerPerOp(benchmark::State& state) {
  profiler::clear();
  profiler::enable(true);
  run_add(state);
  profiler::enable(false);
  state.counters["events"] = static_cast<double>(profiler::collect().size());
  profiler::clear();  // the buffers grow by one event per op: keep runs independent
}

void BM_AddProfilerThroughput(benchmark::State& state) {
  profiler::clear();
  profiler::enable_throughput(true);
  run_add(state);
  profiler::enable_throughput(false);
  profiler::clear();
}

// A step marker pair per iteration: what a trainer pays per step in either mode.
void BM_StepMarkers(benchmark::State& state) {
  profiler::clear();
  profiler::enable_throughput(true);
  int64_t step = 0;
  for (auto _ : state) {
    profiler::step_begin(step++, 64);
    profiler::step_end();
  }
  profiler::enable_throughput(false);
  profiler::clear();
}

// ---- a whole training step ------------------------------------------------------------------

enum class Mode { off, per_op, throughput };

struct TrainSetup {
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<optim::SGD> opt;
  Tensor x, y;
  int64_t step = 0;
  TrainSetup() {
    manual_seed(0);
    model = models::create_model("resnet18_cifar", {.num_classes = 10, .width_mult = 0.25});
    opt = std::make_unique<optim::SGD>(model->parameters(), optim::SgdOptions{.lr = 0.01, .momentum = 0.9});
    x = Tensor::randn({32, 3, 32, 32}).contiguous(MemoryFormat::channels_last);
    std::vector<int64_t> labels(32);
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<int64_t>(i % 10);
    y = Tensor::from_vector(labels, {32});
  }
  // One step as the trainer runs it: markers, phases, forward, loss, backward, optimizer.
  void run_step() {
    profiler::step_begin(step++, 32);
    Tensor loss;
    {
      profiler::PhaseGuard phase(Phase::forward);
      loss = cross_entropy((*model)(x), y);
    }
    opt->zero_grad();
    loss.backward();
    opt->step();
    benchmark::DoNotOptimize(loss.item());
    profiler::step_end();
  }
};

void set_mode(Mode m) {
  profiler::enable(false);
  profiler::enable_throughput(false);
  if (m == Mode::per_op) profiler::enable(true);
  if (m == Mode::throughput) profiler::enable_throughput(true);
}

void BM_TrainStep(benchmark::State& state) {
  const Mode m = static_cast<Mode>(state.range(0));
  TrainSetup t;
  t.run_step();  // warm-up: oneDNN creates its primitives on first use
  profiler::clear();
  set_mode(m);
  for (auto _ : state) t.run_step();
  set_mode(Mode::off);
  state.counters["ops_per_step"] =
      static_cast<double>(profiler::collect().size()) / static_cast<double>(std::max<int64_t>(1, state.iterations()));
  profiler::clear();
}

double thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void BM_TrainStepInterleaved(benchmark::State& state) {
  TrainSetup t;
  for (int i = 0; i < 2; ++i) t.run_step();  // warm-up
  profiler::clear();
  std::vector<double> ms[3], per_op_ratio, tp_ratio, per_op_cpu_ratio;
  int64_t round = 0, per_op_steps = 0;
  for (auto _ : state) {
    double round_ms[3] = {}, round_cpu[3] = {};
    for (int k = 0; k < 3; ++k) {
      const int mi = static_cast<int>((round + k) % 3);  // rotate which mode goes first
      set_mode(static_cast<Mode>(mi));
      const double c0 = thread_cpu_ms();
      const int64_t t0 = profiler::now_ns();
      t.run_step();
      round_ms[mi] = static_cast<double>(profiler::now_ns() - t0) * 1e-6;
      round_cpu[mi] = thread_cpu_ms() - c0;
      ms[mi].push_back(round_ms[mi]);
      per_op_steps += mi == static_cast<int>(Mode::per_op);
    }
    set_mode(Mode::off);
    // Ratios within a round: a slow drift of the machine's load cancels out.
    per_op_ratio.push_back(round_ms[1] / round_ms[0]);
    tp_ratio.push_back(round_ms[2] / round_ms[0]);
    per_op_cpu_ratio.push_back(round_cpu[1] / round_cpu[0]);
    ++round;
  }
  state.counters["off_ms"] = median(ms[0]);
  state.counters["per_op_ms"] = median(ms[1]);
  state.counters["throughput_ms"] = median(ms[2]);
  state.counters["per_op_overhead_pct"] = 100.0 * (median(per_op_ratio) - 1.0);
  state.counters["throughput_overhead_pct"] = 100.0 * (median(tp_ratio) - 1.0);
  // The same on this thread's CPU time: less sensitive to other processes taking the CPU, and
  // the whole step's work when OMP_NUM_THREADS=1.
  state.counters["per_op_cpu_overhead_pct"] = 100.0 * (median(per_op_cpu_ratio) - 1.0);
  state.counters["ops_per_step"] =
      static_cast<double>(profiler::collect().size()) / static_cast<double>(std::max<int64_t>(1, per_op_steps));
  profiler::clear();
}

BENCHMARK(BM_AddProfilerOff);
BENCHMARK(BM_AddProfilerPerOp);
BENCHMARK(BM_AddProfilerThroughput);
BENCHMARK(BM_StepMarkers);
BENCHMARK(BM_TrainStep)->ArgName("mode")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->MinTime(5);
BENCHMARK(BM_TrainStepInterleaved)->Unit(benchmark::kMillisecond)->MinTime(20);

}  // namespace

BENCHMARK_MAIN();
