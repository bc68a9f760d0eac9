// conv2d and its two gradients reach the GPU through cuDNN's convolution API
// (cudnnConvolutionForward / BackwardData / BackwardFilter; groups via cudnnSetConvolutionGroupCount).
// NCHW or channels-last is told to cuDNN through the tensor strides and the filter format. The
// algorithm comes from cuDNN's heuristics (cudnnGetConvolution*Algorithm_v7), or in benchmark mode
// from timing them all (cudnnFindConvolution*AlgorithmEx), is cached per problem (conv_key.h) and
// gets its workspace from the caching allocator; candidates cuDNN cannot run, or whose workspace
// does not fit, are skipped in order. The bias is duet's own kernels: a
// per-channel add forward and the strided reduction for its gradient.
// f16/bf16 tensors (autocast) use cuDNN's pseudo-half configurations: 16-bit data, a FLOAT compute
// type on the convolution descriptor, tensor-core math allowed; products accumulate in f32.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>
#include <vector>
#include "backends/cuda/conv_key.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_util.h"
#include "engine/profiler/events.h"

namespace duet::cuda {
ConvAlgoCache& conv_algo_cache() {
  static ConvAlgoCache c;
  return c;
}
}  // namespace duet::cuda

namespace duet {
using namespace cuda;

namespace {

// Strict FP32 was asked for (the default) and only a tensor-core (TF32) algorithm runs this problem:
// the result has a 10-bit mantissa's rounding. Said once per process on stderr, loudly, since it
// changes the numbers; the profiler's impl column shows math=tensor_op for every such convolution.
void warn_tf32_fallback(const char* op, const std::string& problem) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr,
               "duet: WARNING: %s: no strict-FP32 cuDNN algorithm runs %s, so it runs on TF32 tensor cores (10-bit "
               "mantissa); other convolutions may do the same (the profile's impl column says math=tensor_op). Set "
               "DUET_CUDA_ALLOW_TF32=1 to accept TF32 everywhere, or use f64 where full precision matters.\n",
               op, problem.c_str());
}

const char* algo_name(ConvPass pass, int algo) {
  static const char* fwd[] = {"implicit_gemm", "implicit_precomp_gemm", "gemm", "direct",
                              "fft", "fft_tiling", "winograd", "winograd_nonfused"};
  static const char* bwd_data[] = {"algo_0", "algo_1", "fft", "fft_tiling", "winograd", "winograd_nonfused"};
  static const char* bwd_filter[] = {"algo_0", "algo_1", "fft", "algo_3", "winograd", "winograd_nonfused", "fft_tiling"};
  switch (pass) {
    case ConvPass::forward: return algo >= 0 && algo < 8 ? fwd[algo] : "?";
    case ConvPass::backward_data: return algo >= 0 && algo < 6 ? bwd_data[algo] : "?";
    case ConvPass::backward_filter: return algo >= 0 && algo < 7 ? bwd_filter[algo] : "?";
  }
  return "?";
}

const char* math_name(int m) {
  switch (m) {
    case CUDNN_DEFAULT_MATH: return "default";
    case CUDNN_TENSOR_OP_MATH: return "tensor_op";
    case CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION: return "tensor_op_conversion";
    case CUDNN_FMA_MATH: return "fma";
    default: return "?";
  }
}

// Descriptors of one convolution problem: input x [N, C, H, W], weight [O, C / groups, KH, KW],
// output y [N, O, OH, OW], all in one memory format.
struct Problem {
  const char* op;
  DType dt;
  bool nhwc;
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  ConvKey key;
  bool strict_fp32;  // f32 without TF32: only FMA kernels may run

  Problem(const char* op_name, ConvPass pass, DType t, bool channels_last, const Shape& xs, const Shape& ws,
          const Shape& ys, const Conv2dParams& p, int device)
      : op(op_name), dt(t), nhwc(channels_last), x(op_name), y(op_name), w(op_name), conv(op_name) {
    x.set(dt, xs[0], xs[1], xs[2], xs[3], nhwc);
    y.set(dt, ys[0], ys[1], ys[2], ys[3], nhwc);
    w.set(dt, ws[0], ws[1], ws[2], ws[3], nhwc);
    DUET_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(conv, to_int(op, "pad_h", p.pad_h), to_int(op, "pad_w", p.pad_w),
                                                     to_int(op, "stride_h", p.stride_h), to_int(op, "stride_w", p.stride_w),
                                                     to_int(op, "dilation_h", p.dilation_h),
                                                     to_int(op, "dilation_w", p.dilation_w), CUDNN_CROSS_CORRELATION,
                                                     cudnn_compute_dtype(dt)),
                     op);
    DUET_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, to_int(op, "groups", p.groups)), op);
    strict_fp32 = dt == DType::f32 && !cuda_allow_tf32();
    // Set before the heuristics are queried: they only propose algorithms for this math type. The
    // 16-bit types are what tensor cores are for (their accumulation stays f32).
    const bool half = dt == DType::f16 || dt == DType::bf16;
    DUET_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, strict_fp32 ? CUDNN_FMA_MATH
                                                       : half      ? CUDNN_TENSOR_OP_MATH
                                                                   : CUDNN_DEFAULT_MATH),
                     op);
    key.pass = pass;
    key.dtype = dt;
    key.channels_last = nhwc;
    key.allow_tf32 = !strict_fp32 && dt == DType::f32;
    key.benchmark = cuda_cudnn_benchmark();
    key.device = device;
    key.n = xs[0], key.c = xs[1], key.h = xs[2], key.w = xs[3];
    key.o = ws[0], key.kh = ws[2], key.kw = ws[3];
    key.p = p;
  }
};

// One heuristic proposal, whichever pass it came from.
struct Candidate {
  int algo;
  int math_type;
  cudnnStatus_t status;
};

// The algorithms a cuDNN query returns, in its order: `max_count(&n)` says how many there can be,
// `query(n, &returned, perfs)` is cudnnGetConvolution*Algorithm_v7 or cudnnFindConvolution*AlgorithmEx.
template <class Perf, class MaxCount, class Query>
std::vector<Candidate> query_candidates(OpGuard& g, MaxCount max_count, Query query) {
  int count = 0, returned = 0;
  DUET_CUDNN_CHECK(max_count(&count), g.op);
  std::vector<Perf> perfs(static_cast<size_t>(std::max(count, 1)));
  DUET_CUDNN_CHECK(query(count, &returned, perfs.data()), g.op);
  std::vector<Candidate> c;
  for (int i = 0; i < returned; ++i)
    c.push_back({static_cast<int>(perfs[static_cast<size_t>(i)].algo), static_cast<int>(perfs[static_cast<size_t>(i)].mathType),
                 perfs[static_cast<size_t>(i)].status});
  return c;
}

// Benchmark mode: cuDNN times every algorithm on the problem's own tensors and returns them fastest
// first (`find(workspace, bytes)`; it writes the pass's output, which the real run then overwrites).
// The workspace it may use is the largest any proposed algorithm asks for, or as much of that as the
// allocator can give (the cache is released at most once); cuDNN reports an algorithm that needs more
// as failed, and the run below skips it.
template <class WorkspaceSize, class Find>
std::vector<Candidate> benchmarked(OpGuard& g, const std::vector<Candidate>& proposed, WorkspaceSize workspace_size,
                                   Find find) {
  size_t bytes = 0;
  for (const Candidate& c : proposed) {
    size_t b = 0;
    if (c.status == CUDNN_STATUS_SUCCESS && workspace_size(c.algo, &b) == CUDNN_STATUS_SUCCESS) bytes = std::max(bytes, b);
  }
  void* p = nullptr;
  for (bool release = true; bytes > 0; release = false, bytes /= 2)
    if ((p = g.ctx.allocator().try_allocate(bytes, MemTag::workspace, release))) break;
  const std::vector<Candidate> timed = find(p, bytes);
  if (p) g.ctx.allocator().deallocate(p, bytes, MemTag::workspace);
  return timed;
}

// Runs `pass` with the cached algorithm, or else tries the candidates in order (cuDNN's heuristics,
// or in benchmark mode its timings) and caches the first that runs. `workspace_size(algo, &bytes)`
// and `run(algo, workspace, bytes)` return cuDNN statuses; `propose()` returns the heuristics'
// candidates, `find(workspace, bytes)` the timed ones.
template <class Propose, class Find, class WorkspaceSize, class Run>
void run_convolution(OpGuard& g, Problem& pb, Propose propose, Find find, WorkspaceSize workspace_size, Run run) {
  auto note = [&](const ConvChoice& c) {
    profiler::note_impl(fmt::format("cudnn {} math={} workspace={}{}", algo_name(pb.key.pass, c.algo), math_name(c.math_type),
                                    format_bytes(double(c.workspace)), pb.key.benchmark ? " (benchmarked)" : ""));
  };
  if (const auto cached = conv_algo_cache().find(pb.key)) {
    DUET_CUDNN_CHECK(cudnnSetConvolutionMathType(pb.conv, static_cast<cudnnMathType_t>(cached->math_type)), g.op);
    Workspace ws(g.ctx, cached->workspace);
    DUET_CUDNN_CHECK(run(cached->algo, ws.get(), ws.bytes()), g.op);
    note(*cached);
    return;
  }
  std::vector<Candidate> candidates = propose();
  if (pb.key.benchmark) candidates = benchmarked(g, candidates, workspace_size, find);
  std::string tried;
  // A workspace that does not fit may release the allocator's cache (a device synchronisation) once
  // per search, not once per candidate.
  bool released = false;
  // First pass keeps the precision asked for; only if nothing runs at all may a tensor-core kernel
  // stand in for strict f32 (the profiler's impl column then says math=tensor_op).
  for (int pass = 0; pass < 2; ++pass) {
    const bool strict = pass == 0 && pb.strict_fp32;
    if (pass == 1 && !pb.strict_fp32) break;
    for (const Candidate& c : candidates) {
      if (c.status != CUDNN_STATUS_SUCCESS) continue;
      int math = c.math_type;
      if (strict) {
        // Tensor-op candidates are TF32 for f32 data; the others run with FMA math pinned on the
        // descriptor, since "default" math would itself allow TF32 on Ampere and newer.
        if (math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
        math = CUDNN_FMA_MATH;
      }
      DUET_CUDNN_CHECK(cudnnSetConvolutionMathType(pb.conv, static_cast<cudnnMathType_t>(math)), g.op);
      size_t bytes = 0;
      if (workspace_size(c.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
      void* p = bytes > 0 ? g.ctx.allocator().try_allocate(bytes, MemTag::workspace, !released) : nullptr;
      if (bytes > 0 && !p) {
        released = true;
        tried += fmt::format(" {} (workspace {} does not fit);", algo_name(pb.key.pass, c.algo), format_bytes(double(bytes)));
        continue;
      }
      const cudnnStatus_t st = run(c.algo, p, bytes);
      if (p) g.ctx.allocator().deallocate(p, bytes, MemTag::workspace);
      if (st == CUDNN_STATUS_SUCCESS) {
        const ConvChoice choice{c.algo, math, bytes};
        conv_algo_cache().insert(pb.key, choice);
        note(choice);
        if (pass == 1) warn_tf32_fallback(g.op, pb.key.str());
        return;
      }
      if (st != CUDNN_STATUS_NOT_SUPPORTED && st != CUDNN_STATUS_BAD_PARAM)
        throw_cudnn_error(st, "cudnnConvolution*", g.op, __FILE__, __LINE__);
      tried += fmt::format(" {} ({});", algo_name(pb.key.pass, c.algo), cudnnGetErrorString(st));
    }
  }
  throw Error(fmt::format("{} on backend 'cuda': cuDNN has no algorithm that runs {}; tried:{}", g.op, pb.key.str(),
                          tried.empty() ? " none proposed" : tried));
}

MemoryFormat mem_format(bool nhwc) { return nhwc ? MemoryFormat::channels_last : MemoryFormat::contiguous; }

void check_format(const char* op, const char* arg, const Tensor& t, bool nhwc) {
  DUET_CHECK(t.dim() == 4 && t.is_contiguous(mem_format(nhwc)), "{} on backend 'cuda': '{}' must be a dense {} 4-D tensor, got shape {} strides {}",
             op, arg, nhwc ? "channels-last" : "NCHW", shape_str(t.shape()), shape_str(t.strides()));
}

// The weight in the filter format cuDNN is told about (a copy only when the layouts differ).
Tensor weight_in(const Tensor& w, bool nhwc) { return w.is_contiguous(mem_format(nhwc)) ? w : w.contiguous(mem_format(nhwc)); }

}  // namespace

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  OpGuard g("conv2d", x);
  check_float_or_half(g.op, "input", x);
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
  // Fused ReLU as a second pass on the same stream (cudnnConvolutionBiasActivationForward would
  // fuse it, but takes only some algorithms and layouts; not worth the second code path here).
  if (p.relu && y.numel() > 0) activation(Activation::relu, 0.0, y, y);
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  OpGuard g("conv2d.backward_data", dy);
  check_float_or_half(g.op, "grad_output", dy);
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

void CudaBackend::conv2d_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                                         const Conv2dParams& p) {
  OpGuard g("conv2d.backward_weight", dy);
  check_float_or_half(g.op, "grad_output", dy);
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
    if (!target.same(dw)) copy(target, dw);
  }
  if (dbias.defined() && dbias.numel() > 0) {
    // dbias[o] = sum over n, h, w of dy[n, o, h, w]: the strided reduction keeps dim 1.
    DUET_CHECK(dbias.is_contiguous(), "{} on backend 'cuda': the bias gradient must be contiguous", g.op);
    // On channels-last dy that is a column sum, which the reduction plans as coalesced 32-channel tiles.
    reduce_strided(g, ReduceOp::sum, dy, Shape{1, dy.size(1), 1, 1}, Shape{dy.size(0), 1, dy.size(2), dy.size(3)}, dbias);
  }
}

}  // namespace duet
