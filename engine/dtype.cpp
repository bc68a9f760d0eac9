#include "engine/dtype.h"
#include "engine/error.h"

namespace duet {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: return 4;
    case DType::f64: return 8;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::i64: return 8;
    case DType::i32: return 4;
    case DType::u8: return 1;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::f64: return "f64";
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::i64: return "i64";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

DType dtype_from_name(const std::string& n) {
  for (DType t : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i64, DType::i32, DType::u8})
    if (n == dtype_name(t)) return t;
  throw Error(fmt::format("unknown dtype '{}': expected one of f32, f64, f16, bf16, i64, i32, u8", n));
}

}  // namespace duet
