// --amp as a dtype (see amp.h).
#include "train/amp.h"
#include <fmt/format.h>
#include "engine/error.h"

namespace duet::app {

std::optional<DType> amp_dtype(const std::string& amp) {
  if (amp == "off") return std::nullopt;
  if (amp == "bf16") return DType::bf16;
  if (amp == "fp16") return DType::f16;
  throw Error(fmt::format("--amp {}: expected off, bf16 or fp16", amp));
}

}  // namespace duet::app
