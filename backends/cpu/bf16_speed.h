// How fast this CPU's bf16 dot products run against its f32 FMAs, measured: the planner's bf16
// rules turn on it, and no CPUID flag says it. AVX-512 BF16 is one instruction set with two speeds:
// where vdpbf16ps issues as often as an FMA (AMD Zen 4 and Zen 5) it does twice the multiply-adds,
// and bf16 convolutions beat f32's; where it issues half as often (Intel Xeon without AMX tiles)
// it does the same work as an FMA, and bf16 convolutions only add conversions to f32's arithmetic.
#pragma once

namespace duet::cpu {

// Multiply-adds per second of 512-bit vdpbf16ps over those of 512-bit vfmadd231ps on the calling
// core: about 2 where bf16 dot products run at the FMA's rate, about 1 where at half of it. Timed
// once per process on first use (well under a millisecond); 0 where the CPU has no AVX-512 BF16.
double bf16_dot_speedup();

// Where bf16 dot products do less than this many times f32's multiply-adds, a bf16 convolution is
// no faster than an f32 one and the planner treats its bf16 tensors as f32 wherever f32 has the
// faster algorithm (planner.cpp, winograd_rule).
constexpr double kBf16FastDots = 1.5;

}  // namespace duet::cpu
