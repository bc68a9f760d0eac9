// Device-side helpers shared by the .cu files: dtype dispatch, grid-stride loops and warp/block
// reductions built on shuffles. Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <type_traits>
#include "backends/cuda/kernel_math.h"
#include "backends/cuda/kernels.h"

namespace duet::cuda::kern {

// ---- dtype conversions, the reference backend's rules -------------------------------------------
// Arithmetic happens in a "wide" type: the 16-bit floats widen to float, the rest stay as stored.
template <class S> __host__ __device__ inline auto widen(S v) { return v; }
__host__ __device__ inline float widen(__half v) { return __half2float(v); }
__host__ __device__ inline float widen(__nv_bfloat16 v) { return __bfloat162float(v); }

// Floating values bound for u8/i32 go through int64, as c10 does: a direct conversion of a negative
// float to u8 is undefined, through int64 it wraps like PyTorch.
template <class D, class W> __host__ __device__ inline D narrow(W v) {
  if constexpr (std::is_same_v<D, __half>) return __float2half_rn(static_cast<float>(v));
  else if constexpr (std::is_same_v<D, __nv_bfloat16>) return __float2bfloat16_rn(static_cast<float>(v));
  else if constexpr (std::is_floating_point_v<W> && (std::is_same_v<D, uint8_t> || std::is_same_v<D, int32_t>))
    return static_cast<D>(static_cast<int64_t>(v));
  else return static_cast<D>(v);
}

template <class D, class S> __host__ __device__ inline D convert(S v) { return narrow<D>(widen(v)); }

// The accumulator of a kernel over element type T: T itself, except float for the 16-bit floats
// (as cuDNN and cuBLAS accumulate them).
template <class T> struct Accumulator { using type = T; };
template <> struct Accumulator<__half> { using type = float; };
template <> struct Accumulator<__nv_bfloat16> { using type = float; };
template <class T> using acc_t = typename Accumulator<T>::type;

// One case of a dtype switch: the statement runs with T = type.
#define DUET_DISPATCH_CASE(dtype, type, ...) \
  case ::duet::DType::dtype: {               \
    using T = type;                          \
    __VA_ARGS__;                             \
    break;                                   \
  }

// Runs the statement with T = float or double; other dtypes never reach a kernel (the host code
// rejects them with a message naming the op), so they fall out as cudaErrorInvalidValue.
#define DUET_DISPATCH_FLOAT(dt, ...)                \
  switch (dt) {                                     \
    DUET_DISPATCH_CASE(f32, float, __VA_ARGS__)     \
    DUET_DISPATCH_CASE(f64, double, __VA_ARGS__)    \
    default: return cudaErrorInvalidValue;          \
  }

// DUET_DISPATCH_FLOAT plus the two mixed-precision dtypes, for the kernels autocast reaches
// (conv2d's bias and its gradient); elements are read with widen() and written with narrow<T>().
#define DUET_DISPATCH_FLOAT_OR_HALF(dt, ...)            \
  switch (dt) {                                         \
    DUET_DISPATCH_CASE(f32, float, __VA_ARGS__)         \
    DUET_DISPATCH_CASE(f64, double, __VA_ARGS__)        \
    DUET_DISPATCH_CASE(f16, __half, __VA_ARGS__)        \
    DUET_DISPATCH_CASE(bf16, __nv_bfloat16, __VA_ARGS__) \
    default: return cudaErrorInvalidValue;              \
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
