// The timing behind bf16_dot_speedup() (bf16_speed.h): two loops of independent accumulator chains,
// one of FMAs and one of bf16 dot products, enough chains to keep every pipe busy whatever the
// latency, each timed several times with the fastest kept (a shared machine's other work only ever
// slows a run down).
#include "backends/cpu/bf16_speed.h"
#include <immintrin.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <fmt/format.h>
#include <limits>
#include "backends/cpu/common.h"
#include "backends/cpu/planner.h"

namespace duet::cpu {
namespace {

constexpr int kChains = 12;   // > latency x issue rate of either instruction on current cores
constexpr int kSteps = 2048;  // 24,576 instructions a timing: tens of microseconds
constexpr int kTimings = 7;

using Clock = std::chrono::steady_clock;

// One lane of v: enough to make the loop's result observable (GCC 12's _mm512_reduce_add_ps warns).
__attribute__((target("avx512f"))) float first_lane(__m512 v) { return _mm512_cvtss_f32(v); }

// Seconds for kSteps x kChains FMAs; the result goes to `sink` so the loop cannot be dropped.
__attribute__((target("avx512f"))) double time_fma(float& sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  const auto t0 = Clock::now();
  for (int s = 0; s < kSteps; ++s)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_fmadd_ps(acc[c], a, b);
  const auto t1 = Clock::now();
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  sink += first_lane(total);
  return std::chrono::duration<double>(t1 - t0).count();
}

// Seconds for kSteps x kChains bf16 dot products (each 32 multiply-adds into 16 f32 sums).
__attribute__((target("avx512f,avx512bf16"))) double time_dpbf16(float& sink) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(static_cast<float>(c));
  const __m512bh a = (__m512bh)_mm512_set1_epi16(0x3f80);  // 1.0 in bf16
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3a83);  // about 0.001
  const auto t0 = Clock::now();
  for (int s = 0; s < kSteps; ++s)
    for (int c = 0; c < kChains; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], a, b);
  const auto t1 = Clock::now();
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  sink += first_lane(total);
  return std::chrono::duration<double>(t1 - t0).count();
}

double measure() {
  if (!cpu_caps().avx512_bf16) return 0.0;
  float sink = 0.0f;
  time_fma(sink);  // wakes the 512-bit units up to their steady clock
  time_dpbf16(sink);
  double fma = std::numeric_limits<double>::infinity(), dot = fma;
  for (int i = 0; i < kTimings; ++i) {  // alternated, so both see the same machine
    fma = std::min(fma, time_fma(sink));
    dot = std::min(dot, time_dpbf16(sink));
  }
  volatile float keep = sink;
  (void)keep;
  // A dot product does 32 multiply-adds, an FMA 16: the ratio of rates is 2 x fma / dot.
  return dot > 0.0 ? 2.0 * fma / dot : 0.0;
}

}  // namespace

double bf16_dot_speedup() {
  static const double speedup = measure();
  return speedup;
}

namespace {
std::atomic<KernelPolicy> g_math_in_f32{policy_from_env("DUET_BF16_MATH_IN_F32")};
}  // namespace

void set_bf16_math_in_f32_policy(KernelPolicy p) { g_math_in_f32.store(p); }
KernelPolicy bf16_math_in_f32_policy() { return g_math_in_f32.load(); }

bool bf16_math_in_f32() {
  if (!onednn_computes_bf16()) return false;  // bf16 products go to the reference loops there
  switch (g_math_in_f32.load()) {
    case KernelPolicy::always: return true;
    case KernelPolicy::never: return false;
    case KernelPolicy::automatic: break;
  }
  static const bool slow = !bf16_on_amx() && bf16_dot_speedup() < kBf16FastDots;
  return slow;
}

bool bf16_product_in_f32(double flops, double elements) {
  if (!bf16_math_in_f32()) return false;
  return g_math_in_f32.load() == KernelPolicy::always || flops >= kF32MathMinFlopsPerElement * elements;
}

std::string bf16_math_in_f32_reason(double flops, double elements) {
  if (g_math_in_f32.load() == KernelPolicy::always) return "bf16 in f32: DUET_BF16_MATH_IN_F32=always";
  const double dots = bf16_dot_speedup();
  return fmt::format("bf16 in f32: {:.0f} FLOPs an element >= {:.0f}, {}", flops / elements, kF32MathMinFlopsPerElement,
                     dots > 0 ? fmt::format("bf16 dots {:.1f}x f32's < {}x", dots, kBf16FastDots)
                              : std::string("no bf16 dot products"));
}

}  // namespace duet::cpu
