// Front-ends of max, average and adaptive average pooling. Outputs keep the input's memory
// format. Global average pooling is adaptive_avg_pool2d(x, 1, 1).
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
Shape pooled_shape(const char* op, const Tensor& x, const Pool2dParams& p) {
  check_float_or_half(op, "input", x);
  check_dim(op, "input", x, 4);
  DUET_CHECK(p.kernel_h >= 1 && p.kernel_w >= 1 && p.stride_h >= 1 && p.stride_w >= 1,
             "{}: kernel {}x{} and stride {}x{} must be >= 1", op, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w);
  DUET_CHECK(p.pad_h >= 0 && p.pad_w >= 0 && 2 * p.pad_h <= p.kernel_h && 2 * p.pad_w <= p.kernel_w,
             "{}: padding {}x{} must be >= 0 and at most half the kernel {}x{}", op, p.pad_h, p.pad_w, p.kernel_h,
             p.kernel_w);
  const int64_t OH = pool_out_size(x.size(2), p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode);
  const int64_t OW = pool_out_size(x.size(3), p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode);
  DUET_CHECK(OH > 0 && OW > 0, "{}: a {}x{} window does not fit the input {} (padding {}x{})", op, p.kernel_h,
             p.kernel_w, shape_str(x.shape()), p.pad_h, p.pad_w);
  return {x.size(0), x.size(1), OH, OW};
}
}  // namespace

Tensor max_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  const Shape ys = pooled_shape("max_pool2d", x_in, p);
  const MemoryFormat f = x_in.suggest_memory_format();
  const Tensor x = in_format(untracked(x_in), f);
  const bool grad = should_record({&x_in});
  BackendImpl& be = backend_of(x);
  // Training on a backend that keeps the argmax: the forward writes it (u8 window offsets, so for
  // windows of at most 256 positions), and backward needs nothing else.
  const bool indices = grad && routing(be).keeps_max_pool_indices() && p.kernel_h * p.kernel_w <= 256;
  Tensor y, idx;
  {
    Dispatch<OpId::max_pool2d> kernel(be, {&x});
    y = Tensor::empty(ys, TensorOptions(x.dtype()).with_device(x.device()), f);
    if (indices) idx = Tensor::empty(ys, TensorOptions(DType::u8).with_device(x.device()), f);
    kernel(x, y, idx, p);
  }
  if (grad) {
    // Saved: the argmax, or x and y to find it again.
    const Tensor xs = indices ? Tensor() : x, yd = indices ? Tensor() : y.detach();
    const Shape shape = x.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    record("max_pool2d", {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = in_format(gs[0], f);
      Dispatch<OpId::max_pool2d_backward> kernel(backend_of(dy), {&dy});
      Tensor dx = Tensor::empty(shape, TensorOptions(dt).with_device(dev), f);
      kernel(xs, yd, idx, dy, dx, p);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor avg_pool2d(const Tensor& x_in, const Pool2dParams& p) {
  const Shape ys = pooled_shape("avg_pool2d", x_in, p);
  const MemoryFormat f = x_in.suggest_memory_format();
  const Tensor x = in_format(untracked(x_in), f);
  Tensor y;
  {
    Dispatch<OpId::avg_pool2d> kernel(backend_of(x), {&x});
    y = Tensor::empty(ys, TensorOptions(x.dtype()).with_device(x.device()), f);
    kernel(x, y, p);
  }
  if (should_record({&x_in})) {
    const Shape xs = x.shape();
    const DType dt = x.dtype();
    record("avg_pool2d", {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = in_format(gs[0], f);
      Dispatch<OpId::avg_pool2d_backward> kernel(backend_of(dy), {&dy});
      Tensor dx = Tensor::empty(xs, TensorOptions(dt).with_device(dy.device()), f);
      kernel(dy, dx, p);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

Tensor adaptive_avg_pool2d(const Tensor& x_in, int64_t out_h, int64_t out_w) {
  check_float_or_half("adaptive_avg_pool2d", "input", x_in);
  check_dim("adaptive_avg_pool2d", "input", x_in, 4);
  DUET_CHECK(out_h >= 1 && out_w >= 1, "adaptive_avg_pool2d: output size {}x{} must be >= 1", out_h, out_w);
  const MemoryFormat f = x_in.suggest_memory_format();
  const Tensor x = in_format(untracked(x_in), f);
  const Shape ys{x.size(0), x.size(1), out_h, out_w};
  Tensor y;
  {
    Dispatch<OpId::adaptive_avg_pool2d> kernel(backend_of(x), {&x});
    y = Tensor::empty(ys, TensorOptions(x.dtype()).with_device(x.device()), f);
    kernel(x, y);
  }
  if (should_record({&x_in})) {
    const Shape xs = x.shape();
    const DType dt = x.dtype();
    record("adaptive_avg_pool2d", {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = in_format(gs[0], f);
      Dispatch<OpId::adaptive_avg_pool2d_backward> kernel(backend_of(dy), {&dy});
      Tensor dx = Tensor::empty(xs, TensorOptions(dt).with_device(dy.device()), f);
      kernel(dy, dx);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}

}  // namespace duet
