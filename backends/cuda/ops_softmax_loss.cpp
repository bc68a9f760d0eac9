// softmax and log_softmax reach the GPU through cudnnSoftmaxForward/Backward (CUDNN_SOFTMAX_ACCURATE
// or CUDNN_SOFTMAX_LOG): a contiguous tensor softmaxed along any dim is viewed as
// [outer, dim, inner, 1] and cuDNN's channel mode normalises over the second axis. Cross-entropy
// is duet's fused kernel (kernels_loss.cu); it validates labels on the device and records an invalid
// one where the host finds it at its next synchronisation (DeviceContext::synchronize), so the loss
// itself never waits for the GPU.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_util.h"

namespace duet {
using namespace cuda;

namespace {

// [outer, len, inner] of a contiguous tensor around dim (a 0-d tensor is one line of length 1).
struct Lines {
  int64_t outer = 1, len = 1, inner = 1;
};
Lines lines(const Tensor& t, int64_t dim) {
  Lines l;
  if (t.dim() == 0) return l;
  l.len = t.size(dim);
  for (int64_t d = 0; d < dim; ++d) l.outer *= t.size(d);
  for (int64_t d = dim + 1; d < t.dim(); ++d) l.inner *= t.size(d);
  return l;
}

void set_lines(TensorDesc& d, DType dt, const Lines& l) { d.set(dt, l.outer, l.len, l.inner, 1, false); }

}  // namespace

void CudaBackend::softmax(const Tensor& x, const Tensor& y, int64_t dim, bool log) {
  OpGuard g(log ? "log_softmax" : "softmax", x);
  DUET_CHECK(x.is_contiguous() && y.is_contiguous(), "{} on backend 'cuda': input and output must be contiguous", g.op);
  if (x.numel() == 0) return;
  const Lines l = lines(x, dim);
  TensorDesc xd(g.op), yd(g.op);
  set_lines(xd, x.dtype(), l);
  set_lines(yd, y.dtype(), l);
  const Scalars s(x.dtype());
  DUET_CUDNN_CHECK(cudnnSoftmaxForward(g.ctx.cudnn(g.op), log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE,
                                       CUDNN_SOFTMAX_MODE_CHANNEL, s.one(), xd, x.raw_data(), s.zero(), yd, y.raw_data()),
                   g.op);
}

void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, const Tensor& dx, int64_t dim, bool log) {
  OpGuard g(log ? "log_softmax.backward" : "softmax.backward", y);
  DUET_CHECK(y.is_contiguous() && dy.is_contiguous() && dx.is_contiguous(),
             "{} on backend 'cuda': output, grad_output and grad_input must be contiguous", g.op);
  if (y.numel() == 0) return;
  const Lines l = lines(y, dim);
  TensorDesc yd(g.op), dyd(g.op), dxd(g.op);
  set_lines(yd, y.dtype(), l);
  set_lines(dyd, dy.dtype(), l);
  set_lines(dxd, dx.dtype(), l);
  const Scalars s(y.dtype());
  DUET_CUDNN_CHECK(cudnnSoftmaxBackward(g.ctx.cudnn(g.op), log ? CUDNN_SOFTMAX_LOG : CUDNN_SOFTMAX_ACCURATE,
                                        CUDNN_SOFTMAX_MODE_CHANNEL, s.one(), yd, y.raw_data(), dyd, dy.raw_data(), s.zero(), dxd,
                                        dx.raw_data()),
                   g.op);
}

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& target, const Tensor& loss, double label_smoothing) {
  OpGuard g("cross_entropy", logits);
  check_on(g.op, "target", target, g.device());
  DUET_CHECK(logits.dim() == 2 && logits.is_contiguous() && target.is_contiguous() && target.dtype() == DType::i64,
             "cross_entropy on backend 'cuda': expected contiguous logits [N, C] and contiguous i64 targets");
  const int64_t N = logits.size(0), C = logits.size(1);
  // One workspace: the bad-row record first (8-byte aligned), then the per-row losses.
  Workspace ws(g.ctx, 256 + kern::cross_entropy_workspace(logits.dtype(), N));
  auto* bad_row = static_cast<unsigned long long*>(ws.get());
  DUET_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned long long), g.stream()), g.op);
  DUET_CUDA_CHECK(kern::cross_entropy(logits.dtype(), logits.raw_data(), target.data<int64_t>(), loss.raw_data(), N, C,
                                      label_smoothing, static_cast<char*>(ws.get()) + 256, bad_row,
                                      g.ctx.label_errors(g.op), g.stream()),
                  g.op);
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& target, const Tensor& dloss,
                                         const Tensor& dlogits, double label_smoothing) {
  OpGuard g("cross_entropy.backward", logits);
  check_on(g.op, "target", target, g.device());
  check_on(g.op, "grad_loss", dloss, g.device());
  DUET_CHECK(logits.is_contiguous() && target.is_contiguous() && dlogits.is_contiguous() && dloss.numel() == 1,
             "cross_entropy.backward on backend 'cuda': expected contiguous logits, targets and gradient, and a scalar "
             "grad_loss");
  const int64_t N = logits.size(0), C = logits.size(1);
  Workspace ws(g.ctx, sizeof(unsigned long long));
  auto* bad_row = static_cast<unsigned long long*>(ws.get());
  DUET_CUDA_CHECK(cudaMemsetAsync(bad_row, 0xff, sizeof(unsigned long long), g.stream()), g.op);
  DUET_CUDA_CHECK(kern::cross_entropy_backward(logits.dtype(), logits.raw_data(), target.data<int64_t>(), dloss.raw_data(),
                                               dlogits.raw_data(), N, C, label_smoothing, bad_row,
                                               g.ctx.label_errors(g.op), g.stream()),
                  g.op);
}

}  // namespace duet
