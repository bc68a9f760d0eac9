#include "engine/ops/dispatch.h"
#include <fmt/format.h>

namespace duet {
namespace {
thread_local OpTrace* t_trace = nullptr;
}  // namespace

OpTrace::OpTrace(const BackendImpl& as) : as_(as), outer_(t_trace) { t_trace = this; }
OpTrace::~OpTrace() { t_trace = outer_; }
OpTrace* OpTrace::current() { return t_trace; }

struct OpTraceAccess {
  static void record(OpTrace& t, OpId op, DType dt) { t.entries_.push_back({op, dt}); }
};

namespace detail {

DType dispatch_dtype(std::initializer_list<const Tensor*> shown) {
  for (const Tensor* t : shown)
    if (t && t->defined()) return t->dtype();
  return DType::f32;
}

BackendImpl& backend_for(BackendImpl& be, OpId op, DType dt, std::string* why) {
  if (t_trace) OpTraceAccess::record(*t_trace, op, dt);
  DTypeSupport s = be.support(op, dt);
  if (s.coverage == Coverage::native) return be;
  // Only a host backend can hand its tensors to the reference loops; under an OpTrace, which only
  // records what a refusal would be, a refused op runs there too.
  if ((s.coverage == Coverage::reference_loops || t_trace) && be.kind() == Backend::cpu) {
    if (why) *why = std::move(s.why);
    return backend(Backend::reference);
  }
  throw Error(fmt::format("{} on backend '{}' does not take dtype {}: {}", op_name(op), be.name(), dtype_name(dt), s.why));
}

void note_fallback(const std::string& why) { profiler::note_impl("reference loops: " + why); }

const BackendImpl& routing(const BackendImpl& be) { return t_trace ? t_trace->as() : be; }

}  // namespace detail
}  // namespace duet
