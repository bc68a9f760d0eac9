// Copies of frozen tensors (Tensor::freeze), kept from one call to the next instead of being made
// at every call: autocast's 16-bit cast of a weight, a weight in a backend's blocked layout. This is
// what makes inference of a frozen model (nn::Module::freeze) pay each weight's conversions once.
// An entry is keyed by the source's storage (its unique id), the freeze in force, the source's
// offset and what the copy is (the caller's name for it); it is dropped once its source storage is
// gone or no longer frozen under that freeze, checked whenever an entry is added, so a copy is never
// taken for contents that may have changed and none outlives its source for long. The copies count
// as parameter memory in the allocator.
#pragma once
#include <functional>
#include <string>
#include "engine/tensor.h"

namespace duet {

// The copy of frozen `t` named `what` (a cast's dtype, a layout's description), made by make() the
// first time under the current freeze. `t` must be frozen.
Tensor frozen_copy(const Tensor& t, const std::string& what, const std::function<Tensor()>& make);
// How many copies are kept now (tests).
size_t frozen_copies_kept();

}  // namespace duet
