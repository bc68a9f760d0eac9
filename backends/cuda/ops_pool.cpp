// Pooling: the forward of max and average pooling in floor mode reaches the GPU through
// cudnnPoolingForward, whose windows, padding and divisors are then exactly PyTorch's. Ceil-mode
// forwards, all backward passes and adaptive pooling are duet's own kernels (kernels_pool.cu):
// cuDNN has no ceil mode, its backward needs forward tensors the op does not pass (avg) or may
// split ties differently from PyTorch's first-maximum rule (max), and it has no adaptive bins.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_util.h"
#include "engine/profiler/events.h"

namespace duet {
using namespace cuda;

namespace {

void check_4d(const char* op, const char* arg, const Tensor& t) {
  DUET_CHECK(t.dim() == 4 && (t.is_contiguous() || t.is_contiguous(MemoryFormat::channels_last)),
             "{} on backend 'cuda': '{}' must be a dense NCHW or channels-last 4-D tensor, got shape {} strides {}", op, arg,
             shape_str(t.shape()), shape_str(t.strides()));
}

void cudnn_pool_forward(OpGuard& g, cudnnPoolingMode_t mode, const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  const bool nhwc = channels_last(x) || channels_last(y);
  DUET_CHECK(x.is_contiguous(nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous) &&
                 y.is_contiguous(nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous),
             "{} on backend 'cuda': input and output must share one memory format", g.op);
  PoolDesc pd(g.op);
  DUET_CUDNN_CHECK(cudnnSetPooling2dDescriptor(pd, mode, CUDNN_PROPAGATE_NAN, to_int(g.op, "kernel_h", p.kernel_h),
                                               to_int(g.op, "kernel_w", p.kernel_w), to_int(g.op, "pad_h", p.pad_h),
                                               to_int(g.op, "pad_w", p.pad_w), to_int(g.op, "stride_h", p.stride_h),
                                               to_int(g.op, "stride_w", p.stride_w)),
                   g.op);
  TensorDesc xd(g.op), yd(g.op);
  xd.set(x.dtype(), x.size(0), x.size(1), x.size(2), x.size(3), nhwc);
  yd.set(y.dtype(), y.size(0), y.size(1), y.size(2), y.size(3), nhwc);
  const Scalars s(x.dtype());
  DUET_CUDNN_CHECK(cudnnPoolingForward(g.ctx.cudnn(g.op), pd, s.one(), xd, x.raw_data(), s.zero(), yd, y.raw_data()), g.op);
  profiler::note_impl("cudnn pooling");
}

}  // namespace

// The CUDA backend keeps no indices (keeps_max_pool_indices() is false): its backward finds each
// window's first maximum again from x and y.
void CudaBackend::max_pool2d(const Tensor& x, const Tensor& y, const Tensor& /*indices*/, const Pool2dParams& p) {
  OpGuard g("max_pool2d", x);
  check_4d(g.op, "input", x);
  check_4d(g.op, "output", y);
  if (y.numel() == 0) return;
  if (!p.ceil_mode) return cudnn_pool_forward(g, CUDNN_POOLING_MAX, x, y, p);
  DUET_CUDA_CHECK(kern::max_pool2d(x.dtype(), x.raw_data(), dims4(x), y.raw_data(), dims4(y), p, g.stream()), g.op);
}

void CudaBackend::max_pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& /*indices*/, const Tensor& dy,
                                      const Tensor& dx, const Pool2dParams& p) {
  OpGuard g("max_pool2d.backward", dy);
  for (const auto& [arg, t] : {std::pair<const char*, const Tensor*>{"input", &x}, {"output", &y}, {"grad_output", &dy},
                               {"grad_input", &dx}})
    check_4d(g.op, arg, *t);
  DUET_CUDA_CHECK(kern::max_pool2d_backward(x.dtype(), x.raw_data(), dims4(x), y.raw_data(), dims4(y), dy.raw_data(), dims4(dy),
                                            dx.raw_data(), dims4(dx), p, g.stream()),
                  g.op);
}

void CudaBackend::avg_pool2d(const Tensor& x, const Tensor& y, const Pool2dParams& p) {
  OpGuard g("avg_pool2d", x);
  check_4d(g.op, "input", x);
  check_4d(g.op, "output", y);
  if (y.numel() == 0) return;
  if (!p.ceil_mode)
    return cudnn_pool_forward(g, p.count_include_pad ? CUDNN_POOLING_AVERAGE_COUNT_INCLUDE_PADDING
                                                     : CUDNN_POOLING_AVERAGE_COUNT_EXCLUDE_PADDING,
                              x, y, p);
  DUET_CUDA_CHECK(kern::avg_pool2d(x.dtype(), x.raw_data(), dims4(x), y.raw_data(), dims4(y), p, g.stream()), g.op);
}

void CudaBackend::avg_pool2d_backward(const Tensor& dy, const Tensor& dx, const Pool2dParams& p) {
  OpGuard g("avg_pool2d.backward", dy);
  check_4d(g.op, "grad_output", dy);
  check_4d(g.op, "grad_input", dx);
  DUET_CUDA_CHECK(kern::avg_pool2d_backward(dy.dtype(), dy.raw_data(), dims4(dy), dx.raw_data(), dims4(dx), p, g.stream()), g.op);
}

void CudaBackend::adaptive_avg_pool2d(const Tensor& x, const Tensor& y) {
  OpGuard g("adaptive_avg_pool2d", x);
  check_4d(g.op, "input", x);
  check_4d(g.op, "output", y);
  DUET_CUDA_CHECK(kern::adaptive_avg_pool2d(x.dtype(), x.raw_data(), dims4(x), y.raw_data(), dims4(y), g.stream()), g.op);
}

void CudaBackend::adaptive_avg_pool2d_backward(const Tensor& dy, const Tensor& dx) {
  OpGuard g("adaptive_avg_pool2d.backward", dy);
  check_4d(g.op, "grad_output", dy);
  check_4d(g.op, "grad_input", dx);
  DUET_CUDA_CHECK(kern::adaptive_avg_pool2d_backward(dy.dtype(), dy.raw_data(), dims4(dy), dx.raw_data(), dims4(dx), g.stream()),
                  g.op);
}

}  // namespace duet
