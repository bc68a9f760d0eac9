// SyncBatchNorm's all-reduce (see sync_batch_norm.h). The statistics are small ([C + 1] and [C]
// values per layer), so they go through host memory.
#include "distributed/sync_batch_norm.h"
#include <cstring>
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/nn/layers.h"
#include "engine/profiler/events.h"

namespace duet::dist {

namespace {
Tensor summed(Communicator& comm, const Tensor& t) {
  DUET_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
             "all_reduce_sum: dtype {} of shape {}; expected f32 or f64", dtype_name(t.dtype()), shape_str(t.shape()));
  profiler::PhaseGuard phase(Phase::comm);
  profiler::CommScope op("comm.sync_bn", comm.transport(Device::cpu()), {&t}, [&t] { return OpCost{0.0, 2.0 * static_cast<double>(t.nbytes())}; });
  Tensor h = t.to(Device::cpu()).contiguous().clone();  // a buffer of our own to reduce in place
  if (h.dtype() == DType::f32) comm.all_reduce_sum(h.data<float>(), static_cast<size_t>(h.numel()));
  else comm.all_reduce_sum(h.data<double>(), static_cast<size_t>(h.numel()));
  return h.to(t.device());
}
}  // namespace

Tensor all_reduce_sum(Communicator& comm, const Tensor& t) {
  Tensor out = summed(comm, t.detach());
  if (should_record({&t})) {
    record("all_reduce_sum", {&t}, {&out}, [&comm](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{summed(comm, g[0])};
    });
  }
  return out;
}

int sync_batch_norm(nn::Module& model, Communicator& comm) {
  int n = 0;
  for (const auto& [name, m] : model.named_modules()) {
    if (auto* bn = dynamic_cast<nn::BatchNorm2d*>(m)) {
      bn->sum_over_replicas = [&comm](const Tensor& t) { return all_reduce_sum(comm, t); };
      ++n;
    }
  }
  return n;
}

}  // namespace duet::dist
