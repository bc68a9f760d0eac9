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
// Which backend runs the op is decided here from what the backend declares for the op's dtype
// (BackendImpl::support): itself; for a host backend that declines, the reference loops, visibly
// (the profile names the backend that ran and its implementation column says why); for a device
// backend that declines, a duet::Error naming the op, the dtype and the reason, before anything is
// allocated or run.
#pragma once
#include <initializer_list>
#include <string>
#include <vector>
#include "engine/backend.h"
#include "engine/op_cost.h"
#include "engine/profiler/events.h"

namespace duet {

// The kernels a piece of code dispatches on this thread, as backend `as` would route them: while
// an OpTrace lives, every dispatch records its op and dtype, the front-ends' routing questions
// (keeps_low_precision_activations, fuses_attention, ...) are answered by `as` instead of the
// backend that computes, and an op the host backend refuses runs on the reference loops instead of
// raising its error. Run on the reference backend for a device backend `as` (whose routing asks for
// no fusion the loops lack), it tells which ops a computation would send to that backend without
// its device: the op table skips the cases a backend refuses with this (opcheck/op_check.cpp).
class OpTrace {
public:
  struct Entry {
    OpId op;
    DType dtype;
  };
  explicit OpTrace(const BackendImpl& as);
  ~OpTrace();
  OpTrace(const OpTrace&) = delete;
  OpTrace& operator=(const OpTrace&) = delete;
  const std::vector<Entry>& entries() const { return entries_; }
  const BackendImpl& as() const { return as_; }
  // The trace open on this thread, if any.
  static OpTrace* current();

private:
  friend struct OpTraceAccess;
  const BackendImpl& as_;
  std::vector<Entry> entries_;
  OpTrace* outer_;
};

}  // namespace duet

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

// The backend that runs `op` in dtype `dt` for tensors of `be`: be itself, or the reference backend
// where a host backend declines the dtype (`why` then holds its reason, which Dispatch notes in the
// profile). A device backend that declines throws duet::Error.
BackendImpl& backend_for(BackendImpl& be, OpId op, DType dt, std::string* why = nullptr);
// The dtype a backend's support is asked for: that of the first defined tensor shown.
DType dispatch_dtype(std::initializer_list<const Tensor*> shown);
// Records in the op's profile why the reference backend ran it.
void note_fallback(const std::string& why);
// The backend that answers a front-end's routing questions for tensors of `be`: `be`, or the
// backend an OpTrace stands for.
const BackendImpl& routing(const BackendImpl& be);

template <OpId op>
class Dispatch {
public:
  // `shown`: the tensors whose shapes, dtype and device the profile records for the op.
  // `label`: overrides ops.def's, where one kernel serves several front-end ops (matmul: "bmm",
  // "linear.backward_data", ...).
  Dispatch(BackendImpl& wanted, std::initializer_list<const Tensor*> shown, const char* label = nullptr)
      : be_(backend_for(wanted, op, dispatch_dtype(shown), &fallback_)),
        label_(label),
        scope_(op_name(op), be_.kind(), shown) {}
  // For ops that create their output (a filled or random new tensor): the profile describes the
  // output about to be allocated, since there is no input.
  Dispatch(BackendImpl& wanted, const Shape& out_shape, DType dtype, Device device)
      : be_(backend_for(wanted, op, dtype, &fallback_)), scope_(op_name(op), be_.kind(), out_shape, dtype, device) {}
  Dispatch(const Dispatch&) = delete;
  Dispatch& operator=(const Dispatch&) = delete;

  // Calls the kernel with its ops.def parameters; the op's window closes when Dispatch goes.
  template <class... Args>
  void operator()(const Args&... args) {
    scope_.set_name(label_ ? label_ : OpTable<op>::label_of(args...));
    scope_.set_cost([&] { return OpTable<op>::cost_of(args...); });
    if (!fallback_.empty()) note_fallback(fallback_);
    (be_.*OpTable<op>::kernel)(args...);
  }

private:
  std::string fallback_;  // why the reference loops run the op instead of the backend asked for
  BackendImpl& be_;
  const char* label_ = nullptr;
  profiler::OpScope scope_;
};

}  // namespace duet::detail
