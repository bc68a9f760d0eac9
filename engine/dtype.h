// Element types. f32 is the default; f64 serves gradient checks; f16/bf16 are storage types for
// mixed precision; i64/i32 hold labels and indices; u8 holds images.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace duet {

enum class DType : uint8_t { f32, f64, f16, bf16, i64, i32, u8 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // throws duet::Error for unknown names
inline bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

template <class T> struct dtype_of;
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<uint8_t> { static constexpr DType value = DType::u8; };

}  // namespace duet
