// matmul and linear reach the GPU as one cublasGemmStridedBatchedEx call. cuBLAS is column-major
// and duet row-major, so out = A B is computed as out^T = B^T A^T: a row-major matrix is its own
// transpose in column-major, so no data moves. A batch of 1 broadcasts with batch stride 0.
// linear's bias is broadcast into y first (the strided copy kernel) and the GEMM accumulates onto
// it with beta = 1, which every cuBLAS version supports for every dtype. f16/bf16 operands (autocast)
// go to the same call with CUDA_R_16F / CUDA_R_16BF matrices and CUBLAS_COMPUTE_32F: products
// accumulate in f32 on tensor cores and only the output is rounded to 16 bits.
#include <algorithm>
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cublas_library.h"
#include "backends/cuda/cuda_check.h"
#include "engine/profiler/events.h"

namespace duet {
using namespace cuda;

namespace {

struct Gemm {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;  // a stored [K, M] / b stored [N, K] when set
  int64_t stride_a = 0, stride_b = 0;     // batch strides in elements, 0 to broadcast
  double beta = 0.0;
};

// out[b, M, N] (row-major, contiguous) = op(a[b]) op(b[b]) + beta * out[b].
void gemm(OpGuard& g, DType dt, const void* a, const void* b, void* out, const Gemm& m) {
  if (m.batch == 0 || m.M == 0 || m.N == 0) return;
  if (m.K == 0) {  // an empty sum, done here rather than trusting every cuBLAS version with k = 0
    if (m.beta == 0.0)
      DUET_CUDA_CHECK(cudaMemsetAsync(out, 0, static_cast<size_t>(m.batch * m.M * m.N) * dtype_size(dt), g.stream()), g.op);
    return;  // beta == 1: out already holds what is added to
  }
  const int M = to_int(g.op, "rows M", m.M), N = to_int(g.op, "columns N", m.N), K = to_int(g.op, "inner size K", m.K);
  const int batch = to_int(g.op, "batch", m.batch);
  // cuBLAS computes C' (N x M, column-major = out row-major) = op(B') op(A'), where B' is b's memory
  // read column-major (N x K when b is [K, N] row-major) and A' likewise for a.
  const cublasOperation_t op_b = m.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = m.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int ld_b = std::max(1, m.trans_b ? K : N), ld_a = std::max(1, m.trans_a ? M : K), ld_c = std::max(1, N);
  cublasHandle_t h = g.ctx.cublas(g.op);
  const CublasLibrary& blas = cublas_library(g.op);
  const long long stride_c = static_cast<long long>(m.M) * m.N;
  if (dt == DType::f64) {
    const double alpha = 1.0, beta = m.beta;
    DUET_CUBLAS_CHECK(blas.cublasGemmStridedBatchedEx(h, op_b, op_a, N, M, K, &alpha, b, CUDA_R_64F, ld_b, m.stride_b, a,
                                                 CUDA_R_64F, ld_a, m.stride_a, &beta, out, CUDA_R_64F, ld_c, stride_c, batch,
                                                 CUBLAS_COMPUTE_64F, CUBLAS_GEMM_DEFAULT),
                      g.op);
  } else {
    // alpha and beta are float for every CUBLAS_COMPUTE_32F* type, whatever the matrices hold.
    const float alpha = 1.0f, beta = static_cast<float>(m.beta);
    const cudaDataType_t t = dt == DType::f16 ? CUDA_R_16F : dt == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F;
    // TF32 only changes how f32 inputs are rounded; 16-bit inputs always run on tensor cores.
    const cublasComputeType_t compute =
        dt == DType::f32 && cuda_allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    DUET_CUBLAS_CHECK(blas.cublasGemmStridedBatchedEx(h, op_b, op_a, N, M, K, &alpha, b, t, ld_b, m.stride_b, a, t, ld_a,
                                                 m.stride_a, &beta, out, t, ld_c, stride_c, batch, compute,
                                                 CUBLAS_GEMM_DEFAULT),
                      g.op);
  }
}

// The profiler's impl column: which cuBLAS path ran.
const char* gemm_impl_name(DType dt) {
  switch (dt) {
    case DType::f16: return "cublas gemm f16 (compute 32f)";
    case DType::bf16: return "cublas gemm bf16 (compute 32f)";
    case DType::f32: return cuda_allow_tf32() ? "cublas gemm (tf32)" : "cublas gemm";
    default: return "cublas gemm";
  }
}

}  // namespace

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b) {
  OpGuard g("matmul", a);
  check_on(g.op, "b", b, g.device());
  DUET_CHECK(a.dim() == 3 && b.dim() == 3 && out.dim() == 3 && a.is_contiguous() && b.is_contiguous() && out.is_contiguous(),
             "matmul on backend 'cuda': expected contiguous 3-D operands, got {}, {} and {}", shape_str(a.shape()),
             shape_str(b.shape()), shape_str(out.shape()));
  Gemm m;
  m.batch = out.size(0);
  m.M = out.size(1);
  m.N = out.size(2);
  m.K = trans_a ? a.size(1) : a.size(2);
  m.trans_a = trans_a;
  m.trans_b = trans_b;
  m.stride_a = a.size(0) == 1 ? 0 : m.M * m.K;
  m.stride_b = b.size(0) == 1 ? 0 : m.K * m.N;
  gemm(g, a.dtype(), a.raw_data(), b.raw_data(), out.raw_data(), m);
  profiler::note_impl(gemm_impl_name(a.dtype()));
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  OpGuard g("linear", x);
  check_on(g.op, "weight", w, g.device());
  DUET_CHECK(x.is_contiguous() && w.is_contiguous() && y.is_contiguous(),
             "linear on backend 'cuda': x, weight and y must be contiguous");
  Gemm m;
  m.M = x.size(0);
  m.N = w.size(0);
  m.K = x.size(1);
  m.trans_b = true;  // y = x w^T with w stored [O, I]
  if (bias.defined() && y.numel() > 0) {
    check_on(g.op, "bias", bias, g.device());
    // y[n, o] = bias[o]: the copy kernel reads bias with stride 0 along the rows.
    const Shape bias_strides{0, bias.stride(0)};
    const Shape* st[2] = {&y.strides(), &bias_strides};
    DUET_CUDA_CHECK(kern::copy(y.dtype(), y.raw_data(), bias.dtype(), bias.raw_data(), offset_calc<2>(g.op, y.shape(), st),
                               y.numel(), g.stream()),
                    g.op);
    m.beta = 1.0;
  }
  gemm(g, x.dtype(), x.raw_data(), w.raw_data(), y.raw_data(), m);
  profiler::note_impl(gemm_impl_name(x.dtype()));
}

}  // namespace duet

namespace duet {

// The fused attention op is optional (BackendImpl::fuses_attention, false here): on the GPU the
// front-end composes attention from the cuBLAS matmuls and cuDNN's softmax above, so these are
// never reached through the front-end. A direct call is told so.
void CudaBackend::attention(const Tensor&, int64_t, double, const Tensor&, const Tensor&) {
  not_implemented(OpId::attention);
}
void CudaBackend::attention_backward(const Tensor&, const Tensor&, const Tensor&, int64_t, double, const Tensor&) {
  not_implemented(OpId::attention_backward);
}

}  // namespace duet
