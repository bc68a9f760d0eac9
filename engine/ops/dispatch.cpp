#include "engine/ops/dispatch.h"
#include <fmt/format.h>

namespace duet {
namespace {
thread_local uint64_t t_dispatched_kernels = 0;
}  // namespace

uint64_t dispatched_kernels() { return t_dispatched_kernels; }

namespace detail {

void count_dispatched_kernel() { ++t_dispatched_kernels; }

BackendImpl& backend_for(BackendImpl& be, OpId op) {
  if (be.implements(op)) return be;
  // Only a host backend can hand its tensors to the reference loops; a device backend without the
  // kernel keeps the op, whose default body names it as not implemented.
  if (be.kind() != Backend::cpu) return be;
  return backend(Backend::reference);
}

void note_fallback(const BackendImpl& wanted, OpId op) {
  profiler::note_impl(fmt::format("reference loops: the {} backend has no {} kernel", wanted.name(), op_name(op)));
}

}  // namespace detail
}  // namespace duet
