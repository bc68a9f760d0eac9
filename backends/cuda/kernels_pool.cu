// Pooling kernels with PyTorch's exact rules, for what cuDNN does not cover: ceil-mode windows
// (cuDNN has no ceil mode and counts padding differently there), every backward pass (the op gives
// no forward tensors to avg-pool backward, and max-pool backward must send the gradient to the
// *first* maximum), and adaptive average pooling (cuDNN has no adaptive bins). One thread per
// element, threads ordered like memory (channels innermost for channels-last) so loads coalesce.
// Averages gather from the windows covering an input; max-pool backward scatters with atomicAdd.
#include "backends/cuda/kernels_common.cuh"

namespace duet::cuda::kern {

namespace {

struct Index4 {
  int64_t n, c, h, w;
};

// Element i of a 4-D tensor, counted in memory order: (n, h, w, c) for channels-last, else (n, c, h, w).
__device__ inline Index4 unravel(int64_t i, const Dims4& D) {
  Index4 r;
  if (D.sC == 1 && D.C > 1) {
    r.c = i % D.C;
    i /= D.C;
    r.w = i % D.W;
    i /= D.W;
    r.h = i % D.H;
    r.n = i / D.H;
  } else {
    r.w = i % D.W;
    i /= D.W;
    r.h = i % D.H;
    i /= D.H;
    r.c = i % D.C;
    r.n = i / D.C;
  }
  return r;
}

__device__ inline int64_t at(const Dims4& D, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * D.sN + c * D.sC + h * D.sH + w * D.sW;
}

int64_t numel4(const Dims4& D) { return D.N * D.C * D.H * D.W; }

// Padding acts as -infinity; a NaN beats everything, as in PyTorch.
template <class T>
__global__ void max_pool_kernel(const T* x, Dims4 X, T* y, Dims4 Y, Pool2dParams p, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    const Index4 o = unravel(i, Y);
    const math::PoolRange rh = math::pool_window(o.h, p.kernel_h, p.stride_h, p.pad_h, X.H);
    const math::PoolRange rw = math::pool_window(o.w, p.kernel_w, p.stride_w, p.pad_w, X.W);
    T best = -INFINITY;
    for (int64_t h = rh.begin; h < rh.end; ++h)
      for (int64_t w = rw.begin; w < rw.end; ++w) {
        const T v = x[at(X, o.n, o.c, h, w)];
        if (v > best || math::is_nan(v)) best = v;
      }
    y[at(Y, o.n, o.c, o.h, o.w)] = best;
  }
}

// Each output's gradient goes to the first (row-major) window position equal to the forward max.
template <class T>
__global__ void max_pool_backward_kernel(const T* x, Dims4 X, const T* y, Dims4 Y, const T* dy, Dims4 DY, T* dx, Dims4 DX,
                                         Pool2dParams p, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    const Index4 o = unravel(i, Y);
    const math::PoolRange rh = math::pool_window(o.h, p.kernel_h, p.stride_h, p.pad_h, X.H);
    const math::PoolRange rw = math::pool_window(o.w, p.kernel_w, p.stride_w, p.pad_w, X.W);
    const T target = y[at(Y, o.n, o.c, o.h, o.w)];
    bool done = false;
    for (int64_t h = rh.begin; h < rh.end && !done; ++h)
      for (int64_t w = rw.begin; w < rw.end; ++w) {
        const T v = x[at(X, o.n, o.c, h, w)];
        if (v == target || (math::is_nan(v) && math::is_nan(target))) {
          atomicAdd(dx + at(DX, o.n, o.c, h, w), dy[at(DY, o.n, o.c, o.h, o.w)]);
          done = true;
          break;
        }
      }
  }
}

template <class T>
__global__ void avg_pool_kernel(const T* x, Dims4 X, T* y, Dims4 Y, Pool2dParams p, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    const Index4 o = unravel(i, Y);
    const math::PoolRange rh = math::pool_window(o.h, p.kernel_h, p.stride_h, p.pad_h, X.H);
    const math::PoolRange rw = math::pool_window(o.w, p.kernel_w, p.stride_w, p.pad_w, X.W);
    T out = 0;
    if (rh.begin < rh.end && rw.begin < rw.end) {  // a window entirely in padding averages to 0
      T sum = 0;
      for (int64_t h = rh.begin; h < rh.end; ++h)
        for (int64_t w = rw.begin; w < rw.end; ++w) sum += x[at(X, o.n, o.c, h, w)];
      out = sum / T(math::avg_divisor(o.h, o.w, X.H, X.W, p.kernel_h, p.kernel_w, p.stride_h, p.stride_w, p.pad_h,
                                      p.pad_w, p.count_include_pad));
    }
    y[at(Y, o.n, o.c, o.h, o.w)] = out;
  }
}

// dx[ih, iw] gathers dy / divisor from every window that covers it: no atomics, deterministic.
template <class T>
__global__ void avg_pool_backward_kernel(const T* dy, Dims4 DY, T* dx, Dims4 DX, Pool2dParams p, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    const Index4 e = unravel(i, DX);
    const math::PoolRange oh = math::windows_containing(e.h, p.kernel_h, p.stride_h, p.pad_h, DY.H);
    const math::PoolRange ow = math::windows_containing(e.w, p.kernel_w, p.stride_w, p.pad_w, DY.W);
    T acc = 0;
    for (int64_t h = oh.begin; h <= oh.end; ++h)
      for (int64_t w = ow.begin; w <= ow.end; ++w)
        acc += dy[at(DY, e.n, e.c, h, w)] / T(math::avg_divisor(h, w, DX.H, DX.W, p.kernel_h, p.kernel_w, p.stride_h,
                                                                p.stride_w, p.pad_h, p.pad_w, p.count_include_pad));
    dx[at(DX, e.n, e.c, e.h, e.w)] = acc;
  }
}

template <class T>
__global__ void adaptive_avg_kernel(const T* x, Dims4 X, T* y, Dims4 Y, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    const Index4 o = unravel(i, Y);
    const int64_t h0 = math::bin_start(o.h, X.H, Y.H), h1 = math::bin_end(o.h, X.H, Y.H);
    const int64_t w0 = math::bin_start(o.w, X.W, Y.W), w1 = math::bin_end(o.w, X.W, Y.W);
    T sum = 0;
    for (int64_t h = h0; h < h1; ++h)
      for (int64_t w = w0; w < w1; ++w) sum += x[at(X, o.n, o.c, h, w)];
    y[at(Y, o.n, o.c, o.h, o.w)] = sum / T((h1 - h0) * (w1 - w0));
  }
}

template <class T>
__global__ void adaptive_avg_backward_kernel(const T* dy, Dims4 DY, T* dx, Dims4 DX, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    const Index4 e = unravel(i, DX);
    const math::PoolRange bh = math::bins_containing(e.h, DX.H, DY.H), bw = math::bins_containing(e.w, DX.W, DY.W);
    T acc = 0;
    for (int64_t h = bh.begin; h <= bh.end; ++h) {
      const int64_t h0 = math::bin_start(h, DX.H, DY.H), h1 = math::bin_end(h, DX.H, DY.H);
      if (e.h < h0 || e.h >= h1) continue;
      for (int64_t w = bw.begin; w <= bw.end; ++w) {
        const int64_t w0 = math::bin_start(w, DX.W, DY.W), w1 = math::bin_end(w, DX.W, DY.W);
        if (e.w < w0 || e.w >= w1) continue;
        acc += dy[at(DY, e.n, e.c, h, w)] / T((h1 - h0) * (w1 - w0));
      }
    }
    dx[at(DX, e.n, e.c, e.h, e.w)] = acc;
  }
}

}  // namespace

cudaError_t max_pool2d(DType dt, const void* x, const Dims4& X, void* y, const Dims4& Y, const Pool2dParams& p,
                       cudaStream_t s) {
  const int64_t n = numel4(Y);
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, max_pool_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(x), X, static_cast<T*>(y), Y, p, n));
  return launched();
}

cudaError_t max_pool2d_backward(DType dt, const void* x, const Dims4& X, const void* y, const Dims4& Y, const void* dy,
                                const Dims4& DY, void* dx, const Dims4& DX, const Pool2dParams& p, cudaStream_t s) {
  // dx is dense (NCHW or channels-last), so zeroing its span zeroes exactly the tensor.
  if (const cudaError_t e = cudaMemsetAsync(dx, 0, static_cast<size_t>(numel4(DX)) * dtype_size(dt), s); e != cudaSuccess)
    return e;
  const int64_t n = numel4(Y);
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, max_pool_backward_kernel<T><<<grid(n), math::kBlock, 0, s>>>(
                              static_cast<const T*>(x), X, static_cast<const T*>(y), Y, static_cast<const T*>(dy), DY,
                              static_cast<T*>(dx), DX, p, n));
  return launched();
}

cudaError_t avg_pool2d(DType dt, const void* x, const Dims4& X, void* y, const Dims4& Y, const Pool2dParams& p,
                       cudaStream_t s) {
  const int64_t n = numel4(Y);
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, avg_pool_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(x), X, static_cast<T*>(y), Y, p, n));
  return launched();
}

cudaError_t avg_pool2d_backward(DType dt, const void* dy, const Dims4& DY, void* dx, const Dims4& DX,
                                const Pool2dParams& p, cudaStream_t s) {
  const int64_t n = numel4(DX);
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, avg_pool_backward_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(dy), DY,
                                                                                      static_cast<T*>(dx), DX, p, n));
  return launched();
}

cudaError_t adaptive_avg_pool2d(DType dt, const void* x, const Dims4& X, void* y, const Dims4& Y, cudaStream_t s) {
  const int64_t n = numel4(Y);
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, adaptive_avg_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(x), X, static_cast<T*>(y), Y, n));
  return launched();
}

cudaError_t adaptive_avg_pool2d_backward(DType dt, const void* dy, const Dims4& DY, void* dx, const Dims4& DX,
                                         cudaStream_t s) {
  const int64_t n = numel4(DX);
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, adaptive_avg_backward_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(dy), DY,
                                                                                          static_cast<T*>(dx), DX, n));
  return launched();
}

}  // namespace duet::cuda::kern
