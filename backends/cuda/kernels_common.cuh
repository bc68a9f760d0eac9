// Device-side helpers shared by the .cu files: dtype dispatch, grid-stride loops and warp/block
// reductions built on shuffles. Included by .cu files only.
#pragma once
#include <cuda_runtime.h>
#include "backends/cuda/kernel_math.h"
#include "backends/cuda/kernels.h"

namespace duet::cuda::kern {

// Runs the statement with T = float or double; other dtypes never reach a kernel (the host code
// rejects them with a message naming the op), so they fall out as cudaErrorInvalidValue.
#define DUET_DISPATCH_FLOAT(dt, ...)              \
  switch (dt) {                                   \
    case ::duet::DType::f32: {                    \
      using T = float;                            \
      __VA_ARGS__;                                \
      break;                                      \
    }                                             \
    case ::duet::DType::f64: {                    \
      using T = double;                           \
      __VA_ARGS__;                                \
      break;                                      \
    }                                             \
    default: return cudaErrorInvalidValue;        \
  }

// for (i = global thread index; i < n; i += all threads): one loop covers any n with a capped grid.
#define DUET_GRID_STRIDE(i, n)                                                       \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < int64_t(n); \
       i += int64_t(blockDim.x) * gridDim.x)

// The launch status: a bad configuration shows up here, a fault inside the kernel only at the
// next synchronising call.
inline cudaError_t launched() { return cudaGetLastError(); }

inline unsigned grid(int64_t n, int block = math::kBlock) { return static_cast<unsigned>(math::grid_for(n, block)); }

template <class A>
__device__ inline A warp_sum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

template <class A>
__device__ inline A warp_max(A v) {
  for (int o = 16; o > 0; o >>= 1) v = math::max_nan(v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `scratch` is 32 elements of shared memory; it may be reused after the call returns.
template <class A>
__device__ inline A block_sum(A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = int(threadIdx.x) < warps ? scratch[lane] : A(0);
  if (warp == 0) v = warp_sum(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

template <class A>
__device__ inline A block_max(A v, A* scratch, A lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = int(threadIdx.x) < warps ? scratch[lane] : lowest;
  if (warp == 0) v = warp_max(v);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  v = scratch[0];
  __syncthreads();
  return v;
}

// 32 elements of shared memory of type A, declared once per kernel as raw storage so kernels
// templated on the element type do not declare conflicting __shared__ arrays.
#define DUET_SHARED_SCRATCH(A, name)                           \
  __shared__ alignas(16) unsigned char name##_raw[32 * 8];      \
  A* name = reinterpret_cast<A*>(name##_raw)

}  // namespace duet::cuda::kern
