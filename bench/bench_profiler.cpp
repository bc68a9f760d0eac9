// What the profiler costs per dispatched op: add of two 16-element tensors (the kernel itself is
// a few ns, so the numbers are dispatch + profiler overhead) with profiling off, on in per-op
// mode, and in throughput mode (steps only). Run:
//   build/bench/duet_bench_profiler --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include "engine/duet.h"

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

BENCHMARK(BM_AddProfilerOff);
BENCHMARK(BM_AddProfilerPerOp);
BENCHMARK(BM_AddProfilerThroughput);
BENCHMARK(BM_StepMarkers);

}  // namespace

BENCHMARK_MAIN();
