// The cuda backend's planner (planner.h): the algorithm cache, the problem's descriptors, the names
// the profile shows and the TF32 warning.
#include "backends/cuda/planner.h"
#include <atomic>
#include <cstdio>

namespace duet::cuda {

ConvAlgoCache& conv_algo_cache() {
  static ConvAlgoCache c;
  return c;
}


// The result has a 10-bit mantissa's rounding. Said once per process on stderr, loudly, since it
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

Problem::Problem(const char* op_name, ConvPass pass, DType t, bool channels_last, const Shape& xs, const Shape& ws,
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

}  // namespace duet::cuda
