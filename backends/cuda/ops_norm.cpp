// Batch norm reaches the GPU through cuDNN (cudnnBatchNormalizationForwardTraining /
// ForwardInference / Backward, spatial mode): cuDNN fuses statistics, normalisation and the
// running-stat update, and its running variance is the unbiased one with factor = momentum, which
// is PyTorch's rule. A 2-D [N, C] input is described to cuDNN as [N, C, 1, 1]. Layer norm is duet's
// own kernel (kernels_norm.cu): one block per row, which cuDNN's legacy API has no call for.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_util.h"

namespace duet {
using namespace cuda;

namespace {

// x as cuDNN sees it: [N, C, H, W], or [N, C, 1, 1] for a 2-D input.
Shape as4d(const Tensor& x) { return x.dim() == 4 ? x.shape() : Shape{x.size(0), x.size(1), 1, 1}; }

void check_layout(const char* op, const char* arg, const Tensor& t, bool nhwc) {
  const bool ok = t.dim() == 2 ? t.is_contiguous() : t.is_contiguous(nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  DUET_CHECK(ok, "{} on backend 'cuda': '{}' must be dense {} (shape {}, strides {})", op, arg,
             nhwc ? "channels-last" : "NCHW", shape_str(t.shape()), shape_str(t.strides()));
}

void check_param(const char* op, const char* arg, const Tensor& t, int device) {
  check_on(op, arg, t, device);
  DUET_CHECK(t.is_contiguous(), "{} on backend 'cuda': '{}' is updated in place and must be contiguous", op, arg);
}

void set_desc(TensorDesc& d, const Tensor& x, bool nhwc) {
  const Shape s = as4d(x);
  d.set(x.dtype(), s[0], s[1], s[2], s[3], nhwc);
}

void* ptr_or_null(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

}  // namespace

void CudaBackend::batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                             const Tensor& running_var, const Tensor& residual, const Tensor& y, const Tensor& save_mean,
                             const Tensor& save_invstd, const BatchNormParams& p) {
  OpGuard g("batch_norm", x);
  const bool nhwc = channels_last(x) || channels_last(y);
  check_layout(g.op, "input", x, nhwc);
  check_layout(g.op, "output", y, nhwc);
  if (residual.defined()) check_layout(g.op, "residual", residual, nhwc);
  DUET_CHECK(running_mean.defined() && running_var.defined(),
             "batch_norm on backend 'cuda': running_mean and running_var must be given (the front-end passes scratch "
             "buffers when the module keeps none)");
  // cuDNN refuses a smaller epsilon (0 in cuDNN 9, 1e-5 before); raising it would change the result.
  DUET_CHECK(p.eps >= CUDNN_BN_MIN_EPSILON, "batch_norm on backend 'cuda': eps {} is below cuDNN's minimum {}", p.eps,
             CUDNN_BN_MIN_EPSILON);
  check_param(g.op, "running_mean", running_mean, g.device());
  check_param(g.op, "running_var", running_var, g.device());
  const Tensor gm = contiguous(gamma), bt = contiguous(beta);
  const int64_t C = x.size(1);
  if (!p.training && save_mean.defined() && save_invstd.defined()) {
    // The evaluation-mode backward (written with elementwise ops by the front-end) reads these.
    DUET_CUDA_CHECK(kern::batch_norm_eval_stats(x.dtype(), running_mean.raw_data(), running_var.raw_data(),
                                                save_mean.raw_data(), save_invstd.raw_data(), C, p.eps, g.stream()),
                    g.op);
  }
  if (x.numel() == 0) return;
  TensorDesc xd(g.op), yd(g.op), bn(g.op);
  set_desc(xd, x, nhwc);
  set_desc(yd, y, nhwc);
  DUET_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn, xd, CUDNN_BATCHNORM_SPATIAL), g.op);
  const Scalars s(x.dtype());
  cudnnHandle_t h = g.ctx.cudnn(g.op);
  if (p.training) {
    DUET_CUDNN_CHECK(cudnnBatchNormalizationForwardTraining(h, CUDNN_BATCHNORM_SPATIAL, s.one(), s.zero(), xd, x.raw_data(), yd,
                                                            y.raw_data(), bn, gm.raw_data(), bt.raw_data(), p.momentum,
                                                            running_mean.raw_data(), running_var.raw_data(), p.eps,
                                                            ptr_or_null(save_mean), ptr_or_null(save_invstd)),
                     g.op);
  } else {
    DUET_CUDNN_CHECK(cudnnBatchNormalizationForwardInference(h, CUDNN_BATCHNORM_SPATIAL, s.one(), s.zero(), xd, x.raw_data(),
                                                             yd, y.raw_data(), bn, gm.raw_data(), bt.raw_data(),
                                                             running_mean.raw_data(), running_var.raw_data(), p.eps),
                     g.op);
  }
  // The residual add and the activation as passes of their own on the same stream (cuDNN's
  // BatchNormalizationForwardTrainingEx can fuse both, only for NHWC half with a reserve buffer:
  // not worth the second code path here).
  if (residual.defined()) binary(BinaryOp::add, y, residual, y);
  if (p.act) activation(*p.act, 0.0, y, y);
}

void CudaBackend::batch_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& /*beta*/,
                                      const Tensor& save_mean, const Tensor& save_invstd, const Tensor& dx,
                                      const Tensor& dgamma, const Tensor& dbeta, double eps,
                                      std::optional<Activation> act) {
  OpGuard g("batch_norm.backward", dy);
  // cuDNN's backward has no activation; the front-end masks dy first (fuses_batch_norm_activation_backward).
  DUET_CHECK(!act, "{}: a fused {} is not taken on the cuda backend; mask dy first", g.op, activation_name(*act));
  check_on(g.op, "input", x, g.device());
  const bool nhwc = channels_last(x) || channels_last(dy) || (dx.defined() && channels_last(dx));
  check_layout(g.op, "input", x, nhwc);
  check_layout(g.op, "grad_output", dy, nhwc);
  const int64_t C = x.size(1);
  const TensorOptions opts = TensorOptions(x.dtype()).with_device(x.device());
  // cuDNN always writes all three gradients; the ones nobody asked for land in scratch tensors.
  const Tensor dx_t = dx.defined() ? dx : Tensor::empty(x.shape(), opts, nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous);
  const Tensor dg_t = dgamma.defined() ? dgamma : Tensor::empty({C}, opts);
  const Tensor db_t = dbeta.defined() ? dbeta : Tensor::empty({C}, opts);
  check_layout(g.op, "grad_input", dx_t, nhwc);
  check_param(g.op, "grad_weight", dg_t, g.device());
  check_param(g.op, "grad_bias", db_t, g.device());
  if (x.numel() == 0) {
    DUET_CUDA_CHECK(cudaMemsetAsync(dg_t.raw_data(), 0, dg_t.nbytes(), g.stream()), g.op);
    DUET_CUDA_CHECK(cudaMemsetAsync(db_t.raw_data(), 0, db_t.nbytes(), g.stream()), g.op);
    return;
  }
  const Tensor gm = contiguous(gamma), sm = contiguous(save_mean), si = contiguous(save_invstd);
  TensorDesc xd(g.op), dyd(g.op), dxd(g.op), bn(g.op);
  set_desc(xd, x, nhwc);
  set_desc(dyd, dy, nhwc);
  set_desc(dxd, dx_t, nhwc);
  DUET_CUDNN_CHECK(cudnnDeriveBNTensorDescriptor(bn, xd, CUDNN_BATCHNORM_SPATIAL), g.op);
  const Scalars s(x.dtype());
  // With saved statistics cuDNN does not use epsilon, but its documentation asks for the forward's.
  DUET_CUDNN_CHECK(cudnnBatchNormalizationBackward(g.ctx.cudnn(g.op), CUDNN_BATCHNORM_SPATIAL, s.one(), s.zero(), s.one(),
                                                   s.zero(), xd, x.raw_data(), dyd, dy.raw_data(), dxd, dx_t.raw_data(), bn,
                                                   gm.raw_data(), dg_t.raw_data(), db_t.raw_data(), eps, sm.raw_data(),
                                                   si.raw_data()),
                   g.op);
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& y, const Tensor& mean,
                             const Tensor& rstd, double eps) {
  OpGuard g("layer_norm", x);
  DUET_CHECK(x.is_contiguous() && y.is_contiguous() && mean.is_contiguous() && rstd.is_contiguous(),
             "layer_norm on backend 'cuda': input, output and statistics must be contiguous");
  const int64_t D = x.size(-1), rows = D > 0 ? x.numel() / D : 0;
  const Tensor gm = gamma.defined() ? contiguous(gamma) : Tensor(), bt = beta.defined() ? contiguous(beta) : Tensor();
  DUET_CUDA_CHECK(kern::layer_norm(x.dtype(), x.raw_data(), ptr_or_null(gm), ptr_or_null(bt), y.raw_data(), mean.raw_data(),
                                   rstd.raw_data(), rows, D, eps, g.stream()),
                  g.op);
}

void CudaBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, const Tensor& mean,
                                      const Tensor& rstd, const Tensor& dx, const Tensor& dgamma, const Tensor& dbeta) {
  OpGuard g("layer_norm.backward", dy);
  DUET_CHECK(dy.is_contiguous() && x.is_contiguous() && (!dx.defined() || dx.is_contiguous()),
             "layer_norm.backward on backend 'cuda': grad_output, input and grad_input must be contiguous");
  DUET_CHECK((!dgamma.defined() || dgamma.is_contiguous()) && (!dbeta.defined() || dbeta.is_contiguous()),
             "layer_norm.backward on backend 'cuda': grad_weight and grad_bias must be contiguous");
  const int64_t D = x.size(-1), rows = D > 0 ? x.numel() / D : 0;
  const Tensor gm = gamma.defined() ? contiguous(gamma) : Tensor();
  const Tensor mu = contiguous(mean), rs = contiguous(rstd);
  const bool params = dgamma.defined() || dbeta.defined();
  Workspace ws(g.ctx, params ? kern::layer_norm_backward_workspace(x.dtype(), rows, D) : 0);
  DUET_CUDA_CHECK(kern::layer_norm_backward(x.dtype(), dy.raw_data(), x.raw_data(), ptr_or_null(gm), mu.raw_data(),
                                            rs.raw_data(), ptr_or_null(dx), ptr_or_null(dgamma), ptr_or_null(dbeta), rows, D,
                                            ws.get(), g.stream()),
                  g.op);
}

}  // namespace duet
