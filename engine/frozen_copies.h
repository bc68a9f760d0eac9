// Copies of frozen tensors (Tensor::freeze), kept from one call to the next instead of being made
// at every call: autocast's 16-bit cast of a weight, a weight in a backend's blocked layout. This is
// what makes inference of a frozen model (nn::Module::freeze) pay each weight's conversions once.
// An entry is keyed by the source's storage (its unique id), the freeze in force, the source's
// offset and what the copy is (the caller's name for it); it is dropped once its source storage is
// gone or no longer frozen under that freeze, checked whenever an entry is added, so a copy is never
// taken for contents that may have changed and none outlives its source for long. The copies count
// as parameter memory in the allocator.
#pragma once
#include <string_view>
#include <type_traits>
#include "engine/tensor.h"

namespace duet {

namespace detail {
Tensor frozen_copy(const Tensor& t, std::string_view what, Tensor (*make)(void*), void* make_state);
}

// The copy of frozen `t` named `what` (a cast's dtype, a layout's description), made by make() the
// first time under the current freeze. `t` must be frozen. Looked up for every frozen weight of
// every inference op, so neither `what` nor `make` is copied to the heap: make is called through a
// plain function pointer, not a std::function.
template <class Make>
Tensor frozen_copy(const Tensor& t, std::string_view what, Make&& make) {
  using F = std::remove_reference_t<Make>;
  return detail::frozen_copy(t, what, [](void* f) -> Tensor { return (*static_cast<F*>(f))(); },
                             const_cast<void*>(static_cast<const void*>(&make)));
}
// How many copies are kept now (tests).
size_t frozen_copies_kept();

}  // namespace duet
