// --amp of `duet train` and `duet profile`: the autocast dtype of the forward pass (none for "off")
// and its scope. fp16 also needs a loss scaler (optim::GradScaler), which the caller keeps.
#pragma once
#include <optional>
#include <string>
#include "engine/autocast.h"

namespace duet::app {

std::optional<DType> amp_dtype(const std::string& amp);  // "off", "bf16", "fp16"; else duet::Error

// Autocast for the scope of a forward pass when the run uses mixed precision.
struct AmpScope {
  std::optional<AutocastGuard> guard;
  explicit AmpScope(std::optional<DType> low) {
    if (low) guard.emplace(*low);
  }
};

}  // namespace duet::app
