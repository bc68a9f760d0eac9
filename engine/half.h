// The two 16-bit float storage types, decoded and encoded by hand so the reference needs no
// compiler extension: f16 is IEEE 754 binary16, bf16 is the upper half of an f32. Both round to
// nearest, ties to even, like PyTorch's c10::Half and c10::BFloat16.
#pragma once
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <fmt/format.h>
#include "engine/dtype.h"
#include "engine/error.h"
#include "engine/tensor.h"

namespace duet {

// The 16-bit floats (f16, bf16): the mixed-precision dtypes.
inline bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }

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

// Exact, and cheap enough for the inner loops of the reference's f16 convolutions and GEMMs.
inline float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in f32
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31)  // infinity, or NaN (made quiet)
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa ? 0x00400000u | (mantissa << 13) : 0u));
  // Normal: rebias the exponent (15 -> 127) and widen the mantissa (10 -> 23 bits).
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
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

// Arithmetic happens in a "wide" type: the 16-bit floats widen to float, everything else is used
// as stored.
inline float widen(Half v) { return f16_to_float(v.bits); }
inline float widen(BFloat16 v) { return bf16_to_float(v.bits); }
template <class T>
T widen(T v) { return v; }

// Converts a wide value to the storage type To. Floating values bound for a narrow integer type
// go through int64 first, as c10 does, because a direct float -> uint8 cast of a negative value
// is undefined behaviour in C++ (through int64 it wraps, like PyTorch).
template <class To, class W>
To narrow(W v) {
  if constexpr (std::is_same_v<To, Half>) return Half{float_to_f16(static_cast<float>(v))};
  else if constexpr (std::is_same_v<To, BFloat16>) return BFloat16{float_to_bf16(static_cast<float>(v))};
  else if constexpr (std::is_floating_point_v<W> && (std::is_same_v<To, uint8_t> || std::is_same_v<To, int32_t>))
    return static_cast<To>(static_cast<int64_t>(v));
  else return static_cast<To>(v);
}

template <class To, class From>
To convert(From v) {
  if constexpr (std::is_same_v<To, From>) return v;
  else return narrow<To>(widen(v));
}

// Typed pointer to element [0, ..., 0]; the 16-bit float types have no dtype_of<>, so they go
// through raw_data() (the caller has already dispatched on the dtype).
template <class T>
T* ptr(const Tensor& t) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) return static_cast<T*>(t.raw_data());
  else return t.data<T>();
}

// Calls f(T{}) for every storage dtype; f16 and bf16 arrive as their bit-pattern tag types.
// Shared by the reference and cpu backends' copy/fill kernels (backends never include each other).
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

}  // namespace duet
