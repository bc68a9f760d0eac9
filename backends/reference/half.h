// The two 16-bit float storage types, decoded and encoded by hand so the reference needs no
// compiler extension: f16 is IEEE 754 binary16, bf16 is the upper half of an f32. Both round to
// nearest, ties to even, like PyTorch's c10::Half and c10::BFloat16.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <fmt/format.h>
#include "engine/dtype.h"
#include "engine/error.h"

namespace duet::ref {

// Tag types for the raw 16-bit patterns, so templates can tell them apart from uint16_t.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline float bf16_to_float(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  // A NaN must stay a NaN: rounding could carry its payload into the exponent and make infinity.
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x0040u);
  // Round to nearest even on the 16 dropped bits: add just under half, plus one if the kept
  // part is odd. A carry into the exponent is the correct result (up to infinity).
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

inline float f16_to_float(uint16_t h) {
  const bool negative = (h & 0x8000u) != 0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float magnitude;
  if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal: mantissa * 2^-24
  else if (exponent == 31) magnitude = mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  else magnitude = std::ldexp(static_cast<float>(1024 + mantissa), exponent - 25);  // (1 + m/1024) * 2^(e-15)
  return negative ? -magnitude : magnitude;
}

inline uint16_t float_to_f16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (x >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16 (and infinity): too large for f16
  if (x < 0x38800000u) {
    // Below 2^-14 the result is subnormal, an integer count of 2^-24. Scaling by 2^24 is exact,
    // and nearbyint rounds ties to even in the default rounding mode. A result of 1024 encodes
    // the smallest normal number, which is exactly what the bit pattern 0x0400 means.
    const float units = std::nearbyint(std::bit_cast<float>(x) * 0x1p24f);
    return sign | static_cast<uint16_t>(units);
  }
  // Normal: rebias the exponent (127 -> 15), keep the top 10 mantissa bits and round on the 13
  // dropped ones. A carry out of the mantissa correctly bumps the exponent, up to infinity.
  uint32_t h = (x >> 13) - ((127u - 15u) << 10);
  const uint32_t dropped = x & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

// Calls f(T{}) for every storage dtype; f16 and bf16 arrive as their bit-pattern tag types.
// Shared by the reference and cpu backends' copy/fill kernels.
template <class F>
void dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(Half{}); return;
    case DType::bf16: f(BFloat16{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::u8: f(uint8_t{}); return;
  }
  throw Error(fmt::format("unknown dtype code {}", static_cast<int>(t)));
}

}  // namespace duet::ref
