// How fast this CPU's bf16 dot products run against its f32 FMAs, measured: the planner's bf16
// rules turn on it, and no CPUID flag says it. AVX-512 BF16 is one instruction set with two speeds:
// where vdpbf16ps issues as often as an FMA (AMD Zen 4 and Zen 5) it does twice the multiply-adds,
// and bf16 convolutions beat f32's; where it issues half as often (Intel Xeon without AMX tiles)
// it does the same work as an FMA, and bf16 convolutions only add conversions to f32's arithmetic.
#pragma once
#include <string>
#include "backends/cpu/kernel_policy.h"

namespace duet::cpu {

// Multiply-adds per second of 512-bit vdpbf16ps over those of 512-bit vfmadd231ps on the calling
// core: about 2 where bf16 dot products run at the FMA's rate, about 1 where at half of it. Timed
// once per process on first use (well under a millisecond); 0 where the CPU has no AVX-512 BF16.
double bf16_dot_speedup();

// Where bf16 dot products do less than this many times f32's multiply-adds, bf16 arithmetic is
// no faster than f32's (bf16_math_in_f32).
constexpr double kBf16FastDots = 1.5;

// Whether bf16 arithmetic runs in f32 on this CPU, for products worth the conversions
// (bf16_product_in_f32): bf16 tensors are converted on the way in (the reorders into the kernel's
// layout, or a pass before a matrix product) and the result rounded to bf16 on the way out, so the
// tensors between ops stay bf16 (half the memory traffic of the elementwise and normalisation
// passes) while the products run on f32's FMAs. Automatic: where oneDNN computes bf16 (AVX-512),
// without AMX tiles, and where bf16 dot products do less than kBf16FastDots times f32's
// multiply-adds or do not exist. Products of bf16 values are exact in f32 and both ways accumulate
// in f32, so the two differ by summation order only. DUET_BF16_MATH_IN_F32 (always, never) or the
// setter forces it; forced on, every product converts, whatever its size.
bool bf16_math_in_f32();
void set_bf16_math_in_f32_policy(KernelPolicy p);
KernelPolicy bf16_math_in_f32_policy();

// The conversions cost about the same per element whatever the product, the f32 arithmetic saves
// in proportion to its FLOPs: a product is computed in f32 where it does at least this many FLOPs
// per element of its operands and result. Measured on resnet50_cifar's bf16 training step (Intel
// Xeon family 6 model 207, 2 threads, duet profile per op, every layer in f32 against every layer
// in bf16): the 1x1 layers of 64 and 256 channels at 32x32 (102 FLOPs an element) lost 6-32% on
// five of their six passes, the 3-channel stem (51) 9-35%; 256->128 at 32x32 (171) gained 9% over
// its three passes, 128<->512 at 16x16 (205) 13-23%, 1024<->256 at 8x8 (410) 25-40%, the 3x3
// layers (384 and up) 6-37%.
constexpr double kF32MathMinFlopsPerElement = 128;
// Whether a bf16 product of `flops` over `elements` operand and result elements runs in f32.
bool bf16_product_in_f32(double flops, double elements);
// Why, for the profile: "bf16 in f32: 410 FLOPs an element >= 128, bf16 dots 0.6x f32's < 1.5x",
// or the policy that forced it.
std::string bf16_math_in_f32_reason(double flops, double elements);

}  // namespace duet::cpu
