// Fused optimizer updates: one kernel reads param, grad and the optimizer state once and writes
// them back once, instead of the five to ten elementwise launches the update would otherwise be.
// The per-element arithmetic is kernel_math.h's sgd_update/adam_update (tested on the CPU).
#include "backends/cuda/kernels_common.cuh"

namespace duet::cuda::kern {

namespace {

template <class T>
__global__ void sgd_kernel(T* w, const T* g, T* buf, int64_t n, math::SgdConsts<T> c) {
  DUET_GRID_STRIDE(i, n) math::sgd_update(w[i], g[i], c.has_momentum ? buf + i : nullptr, c);
}

template <class T>
__global__ void adam_kernel(T* w, const T* g, T* m, T* v, int64_t n, math::AdamConsts<T> c) {
  DUET_GRID_STRIDE(i, n) math::adam_update(w[i], g[i], m[i], v[i], c);
}

}  // namespace

cudaError_t sgd_step(DType dt, void* param, const void* grad, void* momentum_buf, int64_t n, const SgdParams& p,
                     bool first_step, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, {
    const math::SgdConsts<T> c{T(p.lr), T(p.weight_decay), T(p.momentum), T(1.0 - p.dampening), p.nesterov, first_step,
                               p.momentum != 0.0};
    sgd_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<T*>(param), static_cast<const T*>(grad),
                                                   static_cast<T*>(momentum_buf), n, c);
  });
  return launched();
}

cudaError_t adam_step(DType dt, void* param, const void* grad, void* exp_avg, void* exp_avg_sq, int64_t n,
                      const AdamParams& p, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, adam_kernel<T><<<grid(n), math::kBlock, 0, s>>>(
                              static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(exp_avg),
                              static_cast<T*>(exp_avg_sq), n, math::make_adam_consts<T>(p)));
  return launched();
}

}  // namespace duet::cuda::kern
