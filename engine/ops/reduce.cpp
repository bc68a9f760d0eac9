// Front-ends of the reductions. The kernel always keeps the reduced dims (size 1); dropping them
// is a free view. Gradients broadcast back with expand (a view), so no kernel runs for them.
#include <algorithm>
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
std::vector<int64_t> normalize_dims(const char* op, const Tensor& x, std::vector<int64_t> dims) {
  if (dims.empty()) {
    for (int64_t d = 0; d < x.dim(); ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t& d : dims) d = wrap_dim(d, x.dim(), op);
  std::sort(dims.begin(), dims.end());
  DUET_CHECK(std::adjacent_find(dims.begin(), dims.end()) == dims.end(), "{}: dim repeated in {}", op, dims_str(dims));
  return dims;
}

Shape kept_shape(const Shape& s, const std::vector<int64_t>& dims) {
  Shape k = s;
  for (int64_t d : dims) k[d] = 1;
  return k;
}

Shape dropped_shape(const Shape& s, const std::vector<int64_t>& dims) {
  Shape k;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i)
    if (!std::binary_search(dims.begin(), dims.end(), i)) k.push_back(s[i]);
  return k;
}

Tensor reduce_impl(ReduceOp op, const Tensor& x_in, std::vector<int64_t> dims_in, bool keepdim, const char* name) {
  // Reductions of f16/bf16 tensors (the bias gradients of autocast layers, a broadcast operand's
  // gradient, a mean over a 16-bit map) are computed in f32 and rounded once at the end, as PyTorch
  // accumulates them; the reduction kernels stay f32/f64 only.
  const DType dt = x_in.defined() ? x_in.dtype() : DType::f32;
  if (is_half(dt)) return reduce_impl(op, x_in.to(DType::f32), std::move(dims_in), keepdim, name).to(dt);
  check_float(name, "x", x_in);
  const std::vector<int64_t> dims = normalize_dims(name, x_in, std::move(dims_in));
  const Shape x_shape = x_in.shape();
  const Shape keep = kept_shape(x_shape, dims);
  if (x_in.dim() == 0) return x_in.clone();  // reducing a scalar over no dims is the identity
  // Kernels take any dense layout (channels-last included) as it is.
  const Tensor x = x_in.is_dense() ? x_in : x_in.contiguous();
  Tensor out;
  {
    Dispatch<OpId::reduce> kernel(backend_of(x), {&x});
    out = Tensor::empty(keep, TensorOptions(x.dtype()).with_device(x.device()));
    kernel(op, x, dims, out);
  }
  if (should_record({&x_in})) {
    const Tensor xd = untracked(x), od = out.detach();
    const double count = static_cast<double>(x.numel()) / std::max<double>(1.0, static_cast<double>(out.numel()));
    record(name, {&x_in}, {&out}, [=](const std::vector<Tensor>& gs) {
      const Tensor g = gs[0].reshape(keep);
      Tensor gx;
      switch (op) {
        case ReduceOp::sum: gx = g.expand(x_shape); break;
        case ReduceOp::mean: gx = mul(g, 1.0 / count).expand(x_shape); break;
        case ReduceOp::max:
        case ReduceOp::min: {
          // The gradient is shared evenly among the elements that attain the extremum.
          const Tensor hit = eq(xd, od.expand(x_shape));
          gx = div(mul(hit, g), sum(hit, dims, true));
          break;
        }
        case ReduceOp::count: break;  // not an op: the enum's size
      }
      return std::vector<Tensor>{gx};
    });
  }
  return keepdim ? out : out.view(dropped_shape(x_shape, dims));
}
}  // namespace

Tensor sum(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_impl(ReduceOp::sum, x, std::move(dims), keepdim, "sum");
}
Tensor mean(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_impl(ReduceOp::mean, x, std::move(dims), keepdim, "mean");
}
Tensor amax(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_impl(ReduceOp::max, x, std::move(dims), keepdim, "amax");
}
Tensor amin(const Tensor& x, std::vector<int64_t> dims, bool keepdim) {
  return reduce_impl(ReduceOp::min, x, std::move(dims), keepdim, "amin");
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - static_cast<int64_t>(shape.size());
  DUET_CHECK(lead >= 0, "sum_to: cannot reduce shape {} to the larger shape {}", shape_str(x.shape()), shape_str(shape));
  std::vector<int64_t> dims;
  for (int64_t i = 0; i < x.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
      continue;
    }
    const int64_t want = shape[i - lead];
    DUET_CHECK(want == x.size(i) || want == 1, "sum_to: shape {} does not broadcast to {}", shape_str(shape),
               shape_str(x.shape()));
    if (want == 1 && x.size(i) != 1) dims.push_back(i);
  }
  if (dims.empty()) return x.reshape(shape);
  return reduce_impl(ReduceOp::sum, x, dims, true, "sum").reshape(shape);
}

Tensor argmax(const Tensor& x_in, int64_t dim, bool keepdim) {
  check_float_or_half("argmax", "x", x_in);
  if (is_half(x_in.dtype())) return argmax(x_in.to(DType::f32), dim, keepdim);  // exact: f32 holds every 16-bit value
  dim = wrap_dim(dim, x_in.dim(), "argmax");
  // The host kernels take any dense layout as it is; the cuda kernel wants contiguous.
  const Tensor x = x_in.is_dense() && x_in.device().type == DeviceType::cpu ? x_in : x_in.contiguous();
  const Shape keep = kept_shape(x.shape(), {dim});
  Tensor out;
  {
    Dispatch<OpId::argmax> kernel(backend_of(x), {&x});
    out = Tensor::empty(keep, TensorOptions(DType::i64).with_device(x.device()));
    kernel(x, dim, out);
  }
  return keepdim ? out : out.view(dropped_shape(x.shape(), {dim}));
}

}  // namespace duet
