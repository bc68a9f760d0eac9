// The one way a front-end calls a kernel. Each line of engine/ops.def becomes an OpTable entry
// here (its profile label, its cost and its kernel), and Dispatch<OpId::x> does what every op
// needs around its kernel:
//
//   Dispatch<OpId::conv2d> kernel(be, {&x, &w});   // backend resolved, profiler scope opened
//   y = Tensor::empty(...);                         // outputs allocated inside the op's window
//   kernel(x, w, bias, y, p);                       // label and cost from ops.def, then the kernel
//
// Opening the scope before the outputs are allocated makes the op's bytes_allocated count its
// outputs, so a memory peak is named at the op whose output reached it. The tensors given to the
// constructor are the ones the profile shows (the caller's view of the inputs: a broadcast
// operand as it was given, not as expanded for the kernel).
//
// A host backend without a kernel for an op (BackendImpl::implements) falls back to the
// reference backend here, visibly: the profile names the backend that ran and its implementation
// column says why. Fallbacks for one dtype are the backend's own choice and are noted the same
// way (the cpu backend's f16 convolutions, in backends/cpu/cpu_backend.cpp).
#pragma once
#include <initializer_list>
#include "engine/backend.h"
#include "engine/op_cost.h"
#include "engine/profiler/events.h"

namespace duet::detail {

using cost::elem;

// An op's line of ops.def: its profile label and cost as functions of the kernel's parameters,
// and the kernel's member of BackendImpl.
template <OpId op>
struct OpTable;

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"  // a label or cost reads only some parameters
#define DUET_OP(name, params, label, ...)                   \
  template <>                                               \
  struct OpTable<OpId::name> {                              \
    static const char* label_of params { return label; }    \
    static OpCost cost_of params { return __VA_ARGS__; }    \
    static constexpr auto kernel = &BackendImpl::name;      \
  };
#include "engine/ops.def"
#undef DUET_OP
#pragma GCC diagnostic pop

// The backend that runs `op` for tensors of `be`: be itself, or the reference backend when a host
// backend has no kernel for it (noted in the profile by Dispatch).
BackendImpl& backend_for(BackendImpl& be, OpId op);
// Records in the op's profile why the reference backend ran it instead of `wanted`.
void note_fallback(const BackendImpl& wanted, OpId op);
// Adds one to this thread's dispatched_kernels().
void count_dispatched_kernel();

template <OpId op>
class Dispatch {
public:
  // `shown`: the tensors whose shapes, dtype and device the profile records for the op.
  // `label`: overrides ops.def's, where one kernel serves several front-end ops (matmul: "bmm",
  // "linear.backward_data", ...).
  Dispatch(BackendImpl& wanted, std::initializer_list<const Tensor*> shown, const char* label = nullptr)
      : wanted_(wanted), be_(backend_for(wanted, op)), label_(label), scope_(op_name(op), be_.kind(), shown) {}
  // For ops that create their output (a filled or random new tensor): the profile describes the
  // output about to be allocated, since there is no input.
  Dispatch(BackendImpl& wanted, const Shape& out_shape, DType dtype, Device device)
      : wanted_(wanted), be_(backend_for(wanted, op)), scope_(op_name(op), be_.kind(), out_shape, dtype, device) {}
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  // Calls the kernel with its ops.def parameters; the op's window closes when Dispatch goes.
  template <class... Args>
  void operator()(const Args&... args) {
    scope_.set_name(label_ ? label_ : OpTable<op>::label_of(args...));
    scope_.set_cost([&] { return OpTable<op>::cost_of(args...); });
    if (&be_ != &wanted_) note_fallback(wanted_, op);
    count_dispatched_kernel();
    (be_.*OpTable<op>::kernel)(args...);
  }

private:
  BackendImpl& wanted_;
  BackendImpl& be_;
  const char* label_ = nullptr;
  profiler::OpScope scope_;
};

}  // namespace duet::detail
