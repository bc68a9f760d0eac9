// conv2d and both its gradients reach the GPU through cuDNN's convolution API
// (cudnnConvolutionForward / BackwardData / BackwardFilter; groups via cudnnSetConvolutionGroupCount).
// NCHW or channels-last is told to cuDNN through the tensor strides and the filter format. Which
// algorithm runs is the planner's (planner.h: cuDNN's heuristics or timings, cached per problem);
// workspaces come from the caching allocator. The bias is duet's own kernels: a per-channel add
// forward and the strided reduction for its gradient. f16/bf16 tensors (autocast) use cuDNN's
// pseudo-half configurations: 16-bit data, a FLOAT compute type on the convolution descriptor,
// tensor-core math allowed; products accumulate in f32.
#include "engine/conv_epilogue.h"
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <vector>
#include "backends/cuda/conv_key.h"
#include "backends/cuda/planner.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_util.h"
#include "engine/conv_backward.h"
#include "engine/profiler/events.h"

namespace duet {
using namespace cuda;

namespace {

MemoryFormat mem_format(bool nhwc) { return nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous; }

void check_format(const char* op, const char* arg, const Tensor& t, bool nhwc) {
  DUET_CHECK(t.dim() == 4 && t.is_contiguous(mem_format(nhwc)), "{} on backend 'cuda': '{}' must be a dense {} 4-D tensor, got shape {} strides {}",
             op, arg, nhwc ? "channels-last" : "NCHW", shape_str(t.shape()), shape_str(t.strides()));
}

// The weight in the filter format cuDNN is told about (a copy only when the layouts differ).
Tensor weight_in(const Tensor& w, bool nhwc) { return w.is_contiguous(mem_format(nhwc)) ? w : w.contiguous(mem_format(nhwc)); }

}  // namespace

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                         const Conv2dParams& p) {
  OpGuard g("conv2d", x);
  check_on(g.op, "weight", w, g.device());
  const bool nhwc = channels_last(x) || channels_last(y);
  check_format(g.op, "input", x, nhwc);
  check_format(g.op, "output", y, nhwc);
  const Tensor wk = weight_in(w, nhwc);
  if (y.numel() > 0 && x.numel() > 0) {
    Problem pb(g.op, ConvPass::forward, x.dtype(), nhwc, x.shape(), wk.shape(), y.shape(), p, g.device());
    cudnnHandle_t h = g.ctx.cudnn(g.op);
    const Scalars s(x.dtype());
    const auto count_fwd = [&](int* n) { return cudnnGetConvolutionForwardAlgorithmMaxCount(h, n); };
    run_convolution(
        g, pb,
        [&] {
          return query_candidates<cudnnConvolutionFwdAlgoPerf_t>(
              g, count_fwd,
              [&](int n, int* returned, cudnnConvolutionFwdAlgoPerf_t* perfs) {
                return cudnnGetConvolutionForwardAlgorithm_v7(h, pb.x, pb.w, pb.conv, pb.y, n, returned, perfs);
              });
        },
        [&](void* ws, size_t bytes) {
          return query_candidates<cudnnConvolutionFwdAlgoPerf_t>(
              g, count_fwd,
              [&](int n, int* returned, cudnnConvolutionFwdAlgoPerf_t* perfs) {
                return cudnnFindConvolutionForwardAlgorithmEx(h, pb.x, x.raw_data(), pb.w, wk.raw_data(), pb.conv, pb.y,
                                                              y.raw_data(), n, returned, perfs, ws, bytes);
              });
        },
        [&](int algo, size_t* bytes) {
          return cudnnGetConvolutionForwardWorkspaceSize(h, pb.x, pb.w, pb.conv, pb.y, static_cast<cudnnConvolutionFwdAlgo_t>(algo), bytes);
        },
        [&](int algo, void* ws, size_t bytes) {
          return cudnnConvolutionForward(h, s.one(), pb.x, x.raw_data(), pb.w, wk.raw_data(), pb.conv,
                                         static_cast<cudnnConvolutionFwdAlgo_t>(algo), ws, bytes, s.zero(), pb.y, y.raw_data());
        });
  } else if (y.numel() > 0) {  // no input channels: the sum is empty
    DUET_CUDA_CHECK(cudaMemsetAsync(y.raw_data(), 0, y.nbytes(), g.stream()), g.op);
  }
  if (bias.defined() && y.numel() > 0) {
    check_on(g.op, "bias", bias, g.device());
    const Tensor b = contiguous(bias);
    DUET_CUDA_CHECK(kern::add_channel_bias(y.dtype(), y.raw_data(), dims4(y), b.raw_data(), g.stream()), g.op);
  }
  // The residual and activation as passes on the same stream (cudnnConvolutionBiasActivationForward
  // would fuse relu and the residual, but takes only some algorithms and layouts and no relu6; not
  // worth the second code path before a GPU has measured the difference).
  if (residual.defined()) check_on(g.op, "residual", residual, g.device());
  conv_epilogue_passes(*this, y, residual, p.act);
}

namespace {

void backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  OpGuard g("conv2d.backward_data", dy);
  check_on(g.op, "weight", w, g.device());
  const bool nhwc = channels_last(dx) || channels_last(dy);
  check_format(g.op, "grad_output", dy, nhwc);
  check_format(g.op, "grad_input", dx, nhwc);
  if (dx.numel() == 0) return;
  if (dy.numel() == 0 || w.numel() == 0) {
    DUET_CUDA_CHECK(cudaMemsetAsync(dx.raw_data(), 0, dx.nbytes(), g.stream()), g.op);
    return;
  }
  const Tensor wk = weight_in(w, nhwc);
  Problem pb(g.op, ConvPass::backward_data, dy.dtype(), nhwc, dx.shape(), wk.shape(), dy.shape(), p, g.device());
  cudnnHandle_t h = g.ctx.cudnn(g.op);
  const Scalars s(dy.dtype());
  const auto count_bwd_data = [&](int* n) { return cudnnGetConvolutionBackwardDataAlgorithmMaxCount(h, n); };
  run_convolution(
      g, pb,
      [&] {
        return query_candidates<cudnnConvolutionBwdDataAlgoPerf_t>(
            g, count_bwd_data,
            [&](int n, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
              return cudnnGetConvolutionBackwardDataAlgorithm_v7(h, pb.w, pb.y, pb.conv, pb.x, n, returned, perfs);
            });
      },
      [&](void* ws, size_t bytes) {
        return query_candidates<cudnnConvolutionBwdDataAlgoPerf_t>(
            g, count_bwd_data,
            [&](int n, int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perfs) {
              return cudnnFindConvolutionBackwardDataAlgorithmEx(h, pb.w, wk.raw_data(), pb.y, dy.raw_data(), pb.conv, pb.x,
                                                                 dx.raw_data(), n, returned, perfs, ws, bytes);
            });
      },
      [&](int algo, size_t* bytes) {
        return cudnnGetConvolutionBackwardDataWorkspaceSize(h, pb.w, pb.y, pb.conv, pb.x,
                                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), bytes);
      },
      [&](int algo, void* ws, size_t bytes) {
        return cudnnConvolutionBackwardData(h, s.one(), pb.w, wk.raw_data(), pb.y, dy.raw_data(), pb.conv,
                                            static_cast<cudnnConvolutionBwdDataAlgo_t>(algo), ws, bytes, s.zero(), pb.x,
                                            dx.raw_data());
      });
}

void backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias, const Conv2dParams& p) {
  OpGuard g("conv2d.backward_weight", dy);
  check_on(g.op, "input", x, g.device());
  const bool nhwc = channels_last(x) || channels_last(dy);
  check_format(g.op, "input", x, nhwc);
  check_format(g.op, "grad_output", dy, nhwc);
  if (dw.numel() > 0) {
    // cuDNN writes the filter gradient in the filter format it was told; a dw of the other layout
    // receives a copy.
    const Tensor target = dw.is_contiguous(mem_format(nhwc))
                              ? dw
                              : Tensor::empty(dw.shape(), TensorOptions(dw.dtype()).with_device(dw.device()), mem_format(nhwc));
    if (dy.numel() == 0 || x.numel() == 0) {
      DUET_CUDA_CHECK(cudaMemsetAsync(target.raw_data(), 0, target.nbytes(), g.stream()), g.op);
    } else {
      Problem pb(g.op, ConvPass::backward_filter, dy.dtype(), nhwc, x.shape(), target.shape(), dy.shape(), p, g.device());
      cudnnHandle_t h = g.ctx.cudnn(g.op);
      const Scalars s(dy.dtype());
      const auto count_bwd_filter = [&](int* n) { return cudnnGetConvolutionBackwardFilterAlgorithmMaxCount(h, n); };
      run_convolution(
          g, pb,
          [&] {
            return query_candidates<cudnnConvolutionBwdFilterAlgoPerf_t>(
                g, count_bwd_filter,
                [&](int n, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
                  return cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, pb.x, pb.y, pb.conv, pb.w, n, returned, perfs);
                });
          },
          [&](void* ws, size_t bytes) {
            return query_candidates<cudnnConvolutionBwdFilterAlgoPerf_t>(
                g, count_bwd_filter,
                [&](int n, int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perfs) {
                  return cudnnFindConvolutionBackwardFilterAlgorithmEx(h, pb.x, x.raw_data(), pb.y, dy.raw_data(), pb.conv,
                                                                       pb.w, target.raw_data(), n, returned, perfs, ws, bytes);
                });
          },
          [&](int algo, size_t* bytes) {
            return cudnnGetConvolutionBackwardFilterWorkspaceSize(h, pb.x, pb.y, pb.conv, pb.w,
                                                                  static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), bytes);
          },
          [&](int algo, void* ws, size_t bytes) {
            return cudnnConvolutionBackwardFilter(h, s.one(), pb.x, x.raw_data(), pb.y, dy.raw_data(), pb.conv,
                                                  static_cast<cudnnConvolutionBwdFilterAlgo_t>(algo), ws, bytes, s.zero(), pb.w,
                                                  target.raw_data());
          });
    }
    if (!target.same(dw)) cuda_backend().copy(target, dw);
  }
  if (dbias.defined() && dbias.numel() > 0) {
    // dbias[o] = sum over n, h, w of dy[n, o, h, w]: the strided reduction keeps dim 1.
    DUET_CHECK(dbias.is_contiguous(), "{} on backend 'cuda': the bias gradient must be contiguous", g.op);
    // On channels-last dy that is a column sum, which the reduction plans as coalesced 32-channel tiles.
    reduce_strided(g, ReduceOp::sum, dy, Shape{1, dy.size(1), 1, 1}, Shape{dy.size(0), 1, dy.size(2), dy.size(3)}, dbias);
  }
}

}  // namespace

// Both gradients (ops.def's output mask), each in its profiled window (engine/conv_backward.h).
void CudaBackend::conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                  const Tensor& dw, const Tensor& db, const Conv2dParams& p) {
  if (dx.defined()) {
    const profiler::OpScope window = data_gradient_window(Backend::cuda, dy, w, dx);
    backward_data(dy, w, dx, p);
  }
  if (dw.defined()) {
    const profiler::OpScope window = weight_gradient_window(Backend::cuda, x, dy, dw, db);
    backward_weight(x, dy, dw, db, p);
  }
}

}  // namespace duet
