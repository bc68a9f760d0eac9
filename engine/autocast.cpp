#include "engine/autocast.h"
#include <initializer_list>
#include <iterator>
#include <string_view>
#include <fmt/format.h>
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/error.h"
#include "engine/frozen_copies.h"
#include "engine/half.h"
#include "engine/ops/dispatch.h"
#include "engine/tensor.h"

namespace duet {

namespace {
thread_local std::optional<DType> t_autocast;
}

std::optional<DType> autocast_dtype() { return t_autocast; }

AutocastGuard::AutocastGuard(DType low) : prev_(t_autocast) {
  DUET_CHECK(is_half(low), "AutocastGuard: dtype {} is not a low-precision dtype; expected f16 or bf16",
             dtype_name(low));
  t_autocast = low;
}

AutocastGuard::~AutocastGuard() { t_autocast = prev_; }

namespace detail {

std::optional<DType> autocast_target(std::initializer_list<const Tensor*> inputs) {
  if (!t_autocast) return std::nullopt;
  for (const Tensor* t : inputs)
    if (t && t->defined() && t->dtype() == DType::f32) return t_autocast;
  return std::nullopt;
}

Tensor autocast_input(const Tensor& t, DType low) {
  if (!t.defined() || t.dtype() != DType::f32) return t;
  // A frozen weight (inference: nn::Module::freeze) is cast once and its copy kept, unless a
  // gradient must flow through the cast to it.
  if (t.is_frozen() && !(grad_mode_enabled() && t.requires_grad())) {
    fmt::basic_memory_buffer<char, 32> what;  // on the stack: this runs for every weight of every op
    fmt::format_to(std::back_inserter(what), "cast to {}", dtype_name(low));
    return frozen_copy(t, std::string_view(what.data(), what.size()), [&] {
      const Tensor c = t.detach().to(low);
      c.freeze();
      return c;
    });
  }
  return t.to(low);
}

Tensor autocast_output(const Tensor& y) {
  return detail::routing(backend(y.backend())).keeps_low_precision_activations(y.dtype()) ? y : y.to(DType::f32);
}

}  // namespace detail
}  // namespace duet
