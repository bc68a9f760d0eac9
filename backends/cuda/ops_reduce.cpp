// Reductions reach the GPU as duet's strided reduction kernels (kernels_reduce.cu): the host splits
// x's dims into kept and reduced ones and the kernels walk both index spaces through x's strides,
// so no permuted copy is ever made. math::plan_reduce picks the launch shape from which of the two
// walks is contiguous in memory and from the GPU's SM count. argmax is one thread per output line.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace duet {
namespace cuda {

void reduce_strided(OpGuard& g, ReduceOp op, const Tensor& x, const Shape& kept, const Shape& reduced, const Tensor& out) {
  const Shape* st[1] = {&x.strides()};
  const OffsetCalc<1> kc = offset_calc<1>(g.op, kept, st), rc = offset_calc<1>(g.op, reduced, st);
  // After merging, the innermost remaining dim of each walk says whether it steps through memory
  // one element at a time.
  auto unit_inner = [](const OffsetCalc<1>& c) { return c.ndim > 0 && c.strides[0][c.ndim - 1] == 1; };
  int64_t extent = 1;
  for (int64_t r : reduced) extent *= r;
  const math::ReducePlan plan =
      math::plan_reduce(out.numel(), extent, unit_inner(kc), unit_inner(rc), g.ctx.multiprocessors());
  Workspace ws(g.ctx, kern::reduce_workspace(x.dtype(), plan, out.numel()));
  DUET_CUDA_CHECK(kern::reduce(op, x.dtype(), x.raw_data(), kc, rc, out.numel(), extent, plan, ws.get(), out.raw_data(),
                               g.stream()),
                  g.op);
}

}  // namespace cuda

using namespace cuda;

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  OpGuard g(reduce_name(op), x);
  DUET_CHECK(out.is_contiguous(), "{} on backend 'cuda': out must be contiguous", g.op);
  // Kept dims: x's sizes with the reduced ones set to 1 (merged away); reduced dims: the reverse.
  Shape kept = x.shape(), reduced(static_cast<size_t>(x.dim()), 1);
  int64_t extent = 1;
  for (int64_t d : dims) {
    reduced[d] = x.size(d);
    kept[d] = 1;
    extent *= x.size(d);
  }
  DUET_CHECK(extent > 0 || op == ReduceOp::sum || op == ReduceOp::mean,
             "{} on backend 'cuda': cannot reduce over an empty dimension of shape {}", g.op, shape_str(x.shape()));
  reduce_strided(g, op, x, kept, reduced, out);
}

void CudaBackend::argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  OpGuard g("argmax", x);
  DUET_CHECK(x.is_contiguous() && out.is_contiguous(), "argmax on backend 'cuda': x and out must be contiguous");
  if (x.dim() == 0) {
    DUET_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, sizeof(int64_t), g.stream()), g.op);
    return;
  }
  const int64_t len = x.size(dim);
  DUET_CHECK(len > 0, "argmax on backend 'cuda': dim {} of shape {} is empty", dim, shape_str(x.shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  DUET_CUDA_CHECK(kern::argmax(x.dtype(), x.raw_data(), outer, len, inner, out.data<int64_t>(), g.stream()), g.op);
}

}  // namespace duet
