// Launchers of duet's own CUDA kernels: plain pointers, sizes and a stream in, a cudaError_t out
// (the launch status; the caller wraps it in DUET_CUDA_CHECK with the op's name). This header is
// the whole interface between the host code, which unpacks Tensors, and the .cu files, which see
// no Tensor and no fmt, so nvcc compiles only kernels.
// All pointers are device pointers to element [0, ...] of their tensor. Float kernels take f32 or
// f64 (`dt`), and add_channel_bias and reduce also f16/bf16 (autocast's convolutions); the host
// code has checked the dtype before calling.
#pragma once
#include <cuda_runtime_api.h>
#include <cstddef>
#include <cstdint>
#include "backends/cuda/indexing.h"
#include "backends/cuda/kernel_math.h"
#include "engine/dtype.h"
#include "engine/op_params.h"

namespace duet::cuda::kern {

// A 4-D [N, C, H, W] tensor's sizes and element strides (NCHW or channels-last alike).
struct Dims4 {
  int64_t N = 1, C = 1, H = 1, W = 1;
  int64_t sN = 0, sC = 0, sH = 0, sW = 0;
};

// ---- memory (kernels_memory.cu) ----------------------------------------------------------------
// strides[0] of the calculator are out's.
cudaError_t fill(DType dt, void* out, const OffsetCalc<1>& calc, int64_t n, double value, cudaStream_t s);
// Strided gather with dtype cast: strides[0] are dst's, strides[1] src's (0 where src broadcasts).
cudaError_t copy(DType dst_dt, void* dst, DType src_dt, const void* src, const OffsetCalc<2>& calc, int64_t n,
                 cudaStream_t s);
// Contiguous outputs; element i uses counter offset + i (normal: offset + 2i and 2i + 1).
cudaError_t uniform(DType dt, void* out, int64_t n, double lo, double hi, uint64_t seed, uint64_t offset, cudaStream_t s);
cudaError_t normal(DType dt, void* out, int64_t n, double mean, double stddev, uint64_t seed, uint64_t offset,
                   cudaStream_t s);
// x, y and mask walked as one flat span of n elements (dense, equal strides).
cudaError_t dropout(DType dt, const void* x, void* y, void* mask, int64_t n, double p, uint64_t seed, uint64_t offset,
                    cudaStream_t s);

// ---- elementwise (kernels_elementwise.cu): flat spans of n elements unless strided ------------------
cudaError_t unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, cudaStream_t s);
cudaError_t scalar_op(ScalarOp op, DType dt, const void* x, double scalar, void* out, int64_t n, cudaStream_t s);
// strides[0] out's, [1] a's, [2] b's.
cudaError_t binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, const OffsetCalc<3>& calc, int64_t n,
                   cudaStream_t s);
cudaError_t activation(Activation act, double alpha, DType dt, const void* x, void* out, int64_t n, cudaStream_t s);
cudaError_t activation_backward(Activation act, double alpha, DType dt, const void* x, const void* dy, void* dx, int64_t n,
                                cudaStream_t s);
// y[n, c, h, w] += bias[c] (conv2d's bias; y may be NCHW or channels-last).
cudaError_t add_channel_bias(DType dt, void* y, const Dims4& Y, const void* bias, cudaStream_t s);

// ---- reductions (kernels_reduce.cu) ----------------------------------------------------------------
// out[o] (contiguous, `outputs` of them) = op over r < extent of x[kept.offsets(o) + reduced.offsets(r)],
// spread over the GPU as `plan` (math::plan_reduce) says; `workspace` holds reduce_workspace() bytes.
size_t reduce_workspace(DType dt, const math::ReducePlan& plan, int64_t outputs);
cudaError_t reduce(ReduceOp op, DType dt, const void* x, const OffsetCalc<1>& kept, const OffsetCalc<1>& reduced,
                   int64_t outputs, int64_t extent, const math::ReducePlan& plan, void* workspace, void* out,
                   cudaStream_t s);
// x contiguous viewed as [outer, len, inner]; out[outer, inner] = index of the first maximum (NaN wins).
cudaError_t argmax(DType dt, const void* x, int64_t outer, int64_t len, int64_t inner, int64_t* out, cudaStream_t s);

// ---- normalisation (kernels_norm.cu) -----------------------------------------------------------------
// Rows of D contiguous elements; gamma/beta may be null.
cudaError_t layer_norm(DType dt, const void* x, const void* gamma, const void* beta, void* y, void* mean, void* rstd,
                       int64_t rows, int64_t D, double eps, cudaStream_t s);
// Workspace bytes layer_norm_backward needs for dgamma/dbeta partial sums.
size_t layer_norm_backward_workspace(DType dt, int64_t rows, int64_t D);
// dx, dgamma, dbeta may each be null (not wanted); gamma may be null (no affine weight).
cudaError_t layer_norm_backward(DType dt, const void* dy, const void* x, const void* gamma, const void* mean,
                                const void* rstd, void* dx, void* dgamma, void* dbeta, int64_t rows, int64_t D,
                                void* workspace, cudaStream_t s);
// Evaluation-mode batch norm statistics for the backward pass: save_mean = running_mean,
// save_invstd = 1 / sqrt(running_var + eps) (contiguous [C]).
cudaError_t batch_norm_eval_stats(DType dt, const void* running_mean, const void* running_var, void* save_mean,
                                  void* save_invstd, int64_t C, double eps, cudaStream_t s);

// ---- losses (kernels_loss.cu) ---------------------------------------------------------------------------
// An invalid class label found by a loss kernel, in host-mapped pinned memory (one per device,
// DeviceContext::label_errors): the GPU writes it, the host reads it after its next synchronisation,
// so the loss never makes the host wait. The first error stays until the host has reported it.
struct LabelError {
  int pending = 0;
  int64_t row = 0, label = 0, classes = 0;
};

// Workspace bytes cross_entropy needs (the per-row losses).
size_t cross_entropy_workspace(DType dt, int64_t N);
// logits [N, C] contiguous, target i64 [N] contiguous, loss a scalar. Rows whose label is outside
// [0, C) contribute nothing; the smallest of them is found with `bad_row` (device scratch that must
// hold ~0ull on entry) and written to `errors` (the device's view of the mapped record) unless an
// earlier error is still pending there.
cudaError_t cross_entropy(DType dt, const void* logits, const int64_t* target, void* loss, int64_t N, int64_t C,
                          double label_smoothing, void* workspace, unsigned long long* bad_row, LabelError* errors,
                          cudaStream_t s);
cudaError_t cross_entropy_backward(DType dt, const void* logits, const int64_t* target, const void* dloss, void* dlogits,
                                   int64_t N, int64_t C, double label_smoothing, unsigned long long* bad_row,
                                   LabelError* errors, cudaStream_t s);

// ---- pooling (kernels_pool.cu) -----------------------------------------------------------------------
cudaError_t max_pool2d(DType dt, const void* x, const Dims4& X, void* y, const Dims4& Y, const Pool2dParams& p,
                       cudaStream_t s);
// Zeroes dx, then adds each dy to the first maximum of its window (found again from x and y).
cudaError_t max_pool2d_backward(DType dt, const void* x, const Dims4& X, const void* y, const Dims4& Y, const void* dy,
                                const Dims4& DY, void* dx, const Dims4& DX, const Pool2dParams& p, cudaStream_t s);
cudaError_t avg_pool2d(DType dt, const void* x, const Dims4& X, void* y, const Dims4& Y, const Pool2dParams& p,
                       cudaStream_t s);
cudaError_t avg_pool2d_backward(DType dt, const void* dy, const Dims4& DY, void* dx, const Dims4& DX,
                                const Pool2dParams& p, cudaStream_t s);
cudaError_t adaptive_avg_pool2d(DType dt, const void* x, const Dims4& X, void* y, const Dims4& Y, cudaStream_t s);
cudaError_t adaptive_avg_pool2d_backward(DType dt, const void* dy, const Dims4& DY, void* dx, const Dims4& DX,
                                         cudaStream_t s);

// ---- optimizers (kernels_optim.cu): contiguous, n elements, in place ---------------------------------
cudaError_t sgd_step(DType dt, void* param, const void* grad, void* momentum_buf, int64_t n, const SgdParams& p,
                     bool first_step, cudaStream_t s);
cudaError_t adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n,
                      const AdamParams& p, cudaStream_t s);

}  // namespace duet::cuda::kern
