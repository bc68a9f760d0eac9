// Memory kernels: fill, the strided gather that implements every copy (layout changes, broadcasts,
// dtype casts) and the counter-based random fills. Each thread handles one element of a grid-
// stride loop; the random kernels use engine/rng.h, so their uniform bits equal the CPU backends'.
#include "backends/cuda/kernels_common.cuh"
#include "engine/rng.h"

namespace duet::cuda::kern {

namespace {

template <class T>
__global__ void fill_kernel(T* out, OffsetCalc<1> calc, int64_t n, T value) {
  DUET_GRID_STRIDE(i, n) {
    int64_t off[1];
    calc.offsets(i, off);
    out[off[0]] = value;
  }
}

template <class D, class S>
__global__ void copy_kernel(D* dst, const S* src, OffsetCalc<2> calc, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    int64_t off[2];
    calc.offsets(i, off);
    dst[off[0]] = convert<D>(src[off[1]]);
  }
}

// Same-dtype copies move bits: one kernel per element size instead of one per dtype.
template <class U>
__global__ void move_kernel(U* dst, const U* src, OffsetCalc<2> calc, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    int64_t off[2];
    calc.offsets(i, off);
    dst[off[0]] = src[off[1]];
  }
}

// Calls f(T{}) with T the device type of dtype t.
template <class F>
cudaError_t dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::f32: return f(float{});
    case DType::f64: return f(double{});
    case DType::f16: return f(__half{});
    case DType::bf16: return f(__nv_bfloat16{});
    case DType::i64: return f(int64_t{});
    case DType::i32: return f(int32_t{});
    case DType::u8: return f(uint8_t{});
  }
  return cudaErrorInvalidValue;
}

template <class T>
__global__ void uniform_kernel(T* out, int64_t n, double lo, double hi, uint64_t seed, uint64_t offset) {
  DUET_GRID_STRIDE(i, n) out[i] = math::uniform_value<T>(lo, hi, uniform01(seed, offset + static_cast<uint64_t>(i)));
}

template <class T>
__global__ void normal_kernel(T* out, int64_t n, double mean, double stddev, uint64_t seed, uint64_t offset) {
  DUET_GRID_STRIDE(i, n) {
    const uint64_t c = offset + 2 * static_cast<uint64_t>(i);
    out[i] = static_cast<T>(mean + stddev * math::box_muller(uniform01(seed, c), uniform01(seed, c + 1)));
  }
}

// Element i is kept iff uniform01(seed, offset + i) >= p, exactly the reference's rule, so a CUDA
// and a CPU run with the same generator state drop the same elements.
template <class T>
__global__ void dropout_kernel(const T* x, T* y, T* mask, int64_t n, double p, T scale, uint64_t seed, uint64_t offset) {
  DUET_GRID_STRIDE(i, n) {
    const bool keep = uniform01(seed, offset + static_cast<uint64_t>(i)) >= p;
    const T m = keep ? scale : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

}  // namespace

cudaError_t fill(DType dt, void* out, const OffsetCalc<1>& calc, int64_t n, double value, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  return dispatch_any(dt, [&](auto tag) {
    using T = decltype(tag);
    fill_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<T*>(out), calc, n, narrow<T>(value));
    return launched();
  });
}

cudaError_t copy(DType dst_dt, void* dst, DType src_dt, const void* src, const OffsetCalc<2>& calc, int64_t n,
                 cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (dst_dt == src_dt) {
    switch (dtype_size(dst_dt)) {
      case 1: move_kernel<<<grid(n), math::kBlock, 0, s>>>(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), calc, n); break;
      case 2: move_kernel<<<grid(n), math::kBlock, 0, s>>>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), calc, n); break;
      case 4: move_kernel<<<grid(n), math::kBlock, 0, s>>>(static_cast<uint32_t*>(dst), static_cast<const uint32_t*>(src), calc, n); break;
      case 8: move_kernel<<<grid(n), math::kBlock, 0, s>>>(static_cast<uint64_t*>(dst), static_cast<const uint64_t*>(src), calc, n); break;
      default: return cudaErrorInvalidValue;
    }
    return launched();
  }
  return dispatch_any(dst_dt, [&](auto dst_tag) {
    using D = decltype(dst_tag);
    return dispatch_any(src_dt, [&](auto src_tag) {
      using S = decltype(src_tag);
      copy_kernel<D, S><<<grid(n), math::kBlock, 0, s>>>(static_cast<D*>(dst), static_cast<const S*>(src), calc, n);
      return launched();
    });
  });
}

cudaError_t uniform(DType dt, void* out, int64_t n, double lo, double hi, uint64_t seed, uint64_t offset, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, uniform_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<T*>(out), n, lo, hi, seed, offset));
  return launched();
}

cudaError_t normal(DType dt, void* out, int64_t n, double mean, double stddev, uint64_t seed, uint64_t offset,
                   cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, normal_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<T*>(out), n, mean, stddev, seed, offset));
  return launched();
}

cudaError_t dropout(DType dt, const void* x, void* y, void* mask, int64_t n, double p, uint64_t seed, uint64_t offset,
                    cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, {
    const T scale = p < 1.0 ? static_cast<T>(1.0 / (1.0 - p)) : T(0);
    dropout_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(x), static_cast<T*>(y),
                                                       static_cast<T*>(mask), n, p, scale, seed, offset);
  });
  return launched();
}

}  // namespace duet::cuda::kern
