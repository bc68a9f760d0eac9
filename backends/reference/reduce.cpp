// Reductions on the host: sum/mean/max/min over a set of dims, and argmax along one dim. One
// strided walk over x adds each element into its output slot; accumulators are double, so f32
// sums over millions of elements stay accurate to the last bit a test can see.
#include <cmath>
#include <limits>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

template <class T>
void reduce_kernel(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  const Shape& shape = x.shape();
  // Accumulators form a contiguous tensor of out's shape. Giving it stride 0 on the reduced dims
  // makes every element of x that shares an output slot land on the same accumulator.
  Shape acc_strides = contiguous_strides(out.shape());
  int64_t count = 1;
  for (int64_t d : dims) {
    acc_strides[d] = 0;
    count *= shape[d];
  }
  DUET_CHECK(count > 0 || op == ReduceOp::sum || op == ReduceOp::mean,
             "{} on backend 'reference': cannot reduce over an empty dimension of shape {}", reduce_name(op),
             shape_str(shape));

  double init = 0.0;
  if (op == ReduceOp::max) init = -std::numeric_limits<double>::infinity();
  if (op == ReduceOp::min) init = std::numeric_limits<double>::infinity();
  std::vector<double> acc(static_cast<size_t>(out.numel()), init);

  const T* px = x.data<T>();
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::mean:
      for_each_offset<2>(shape, {x.strides(), acc_strides}, [&](int64_t ox, int64_t oa) { acc[oa] += px[ox]; });
      break;
    case ReduceOp::max:
      for_each_offset<2>(shape, {x.strides(), acc_strides},
                         [&](int64_t ox, int64_t oa) { acc[oa] = max_nan(acc[oa], double(px[ox])); });
      break;
    case ReduceOp::min:
      for_each_offset<2>(shape, {x.strides(), acc_strides},
                         [&](int64_t ox, int64_t oa) { acc[oa] = min_nan(acc[oa], double(px[ox])); });
      break;
    case ReduceOp::count: break;  // not an op: the enum's size
  }

  // mean of an empty set is 0/0 = NaN, as in PyTorch.
  const double scale = op == ReduceOp::mean ? 1.0 / static_cast<double>(count) : 1.0;
  T* po = out.data<T>();
  for_each_offset<2>(out.shape(), {out.strides(), contiguous_strides(out.shape())},
                     [&](int64_t oo, int64_t oa) { po[oo] = static_cast<T>(acc[oa] * scale); });
}

// Index of the first maximum along dim; a NaN counts as larger than everything (PyTorch's rule),
// so the first NaN wins.
template <class T>
void argmax_kernel(const Tensor& x, int64_t dim, const Tensor& out) {
  const T* px = x.data<T>();
  int64_t* po = out.data<int64_t>();
  if (x.dim() == 0) {
    po[0] = 0;
    return;
  }
  const int64_t len = x.size(dim), step = x.stride(dim);
  DUET_CHECK(len > 0, "argmax on backend 'reference': dim {} of shape {} is empty", dim, shape_str(x.shape()));
  // out has size 1 on dim, so walking out's shape visits the start of every line along dim in x.
  for_each_offset<2>(out.shape(), {out.strides(), x.strides()}, [&](int64_t oo, int64_t ox) {
    const T* line = px + ox;
    int64_t best_i = 0;
    T best = line[0];
    for (int64_t k = 1; k < len && !std::isnan(best); ++k) {
      const T v = line[k * step];
      if (std::isnan(v) || v > best) best = v, best_i = k;
    }
    po[oo] = best_i;
  });
}

}  // namespace

void ReferenceBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  dispatch_float(x.dtype(), reduce_name(op), [&](auto tag) { reduce_kernel<decltype(tag)>(op, x, dims, out); });
}

void ReferenceBackend::argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  dispatch_float(x.dtype(), "argmax", [&](auto tag) { argmax_kernel<decltype(tag)>(x, dim, out); });
}

}  // namespace duet
