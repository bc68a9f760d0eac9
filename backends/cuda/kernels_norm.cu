// Layer norm: one block per row (rows are short, 64 to a few thousand elements, and each needs two
// reductions, which a block does with shuffles and no atomics), two passes over the row for a
// numerically safe variance. The weight/bias gradients are column sums over all rows: a 32x8 tile
// per block sums a chunk of rows into a small workspace, and a second kernel adds the chunks, so
// the result is deterministic. Batch norm itself runs in cuDNN; only its evaluation-mode
// statistics for the backward pass are computed here.
#include "backends/cuda/kernels_common.cuh"

namespace duet::cuda::kern {

namespace {

// Rows per chunk of the column sums: at least 32, and never more than 256 chunks in all.
int64_t ln_rows_per_chunk(int64_t rows) {
  const int64_t r = math::ceil_div(rows, 256);
  return r < 32 ? 32 : r;
}
int64_t ln_chunks(int64_t rows) { return rows <= 0 ? 0 : math::ceil_div(rows, ln_rows_per_chunk(rows)); }

template <class T>
__global__ void layer_norm_kernel(const T* x, const T* gamma, const T* beta, T* y, T* mean_out, T* rstd_out, int64_t rows,
                                  int64_t D, T eps) {
  DUET_SHARED_SCRATCH(T, scratch);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * D;
    T* yr = y + row * D;
    T sum = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) sum += xr[d];
    const T mean = block_sum(sum, scratch) / T(D);
    T sq = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const T c = xr[d] - mean;
      sq += c * c;
    }
    const T rstd = T(1) / math::k_sqrt(block_sum(sq, scratch) / T(D) + eps);  // biased variance, as PyTorch
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      T v = (xr[d] - mean) * rstd;
      if (gamma) v *= gamma[d];
      if (beta) v += beta[d];
      yr[d] = v;
    }
    if (threadIdx.x == 0) {
      mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
  }
}

// Per row, with xhat = (x - mean) rstd and g = dy * gamma:  dx = rstd (g - mean(g) - xhat mean(g xhat)).
template <class T>
__global__ void layer_norm_dx_kernel(const T* dy, const T* x, const T* gamma, const T* mean, const T* rstd, T* dx,
                                     int64_t rows, int64_t D) {
  DUET_SHARED_SCRATCH(T, scratch);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * D;
    const T* dyr = dy + row * D;
    const T mu = mean[row], rs = rstd[row];
    T sg = 0, sgx = 0;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const T g = gamma ? dyr[d] * gamma[d] : dyr[d];
      sg += g;
      sgx += g * (xr[d] - mu) * rs;
    }
    const T mean_g = block_sum(sg, scratch) / T(D);
    const T mean_gx = block_sum(sgx, scratch) / T(D);
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      const T g = gamma ? dyr[d] * gamma[d] : dyr[d];
      const T xhat = (xr[d] - mu) * rs;
      dx[row * D + d] = rs * (g - mean_g - xhat * mean_gx);
    }
  }
}

// Block (32, 8) sums rows [chunk * rpc, (chunk + 1) * rpc) of columns [32 bx, 32 bx + 32):
// partial_g[chunk, d] = sum dy xhat, partial_b[chunk, d] = sum dy.
template <class T>
__global__ void layer_norm_column_partials(const T* dy, const T* x, const T* mean, const T* rstd, int64_t rows, int64_t D,
                                           int64_t rows_per_chunk, T* partial_g, T* partial_b) {
  __shared__ T sg[8][33];  // 33: no bank conflicts on the transposed read
  __shared__ T sb[8][33];
  const int64_t d = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  T acc_g = 0, acc_b = 0;
  if (d < D) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y) {
      const T g = dy[r * D + d];
      acc_g += g * (x[r * D + d] - mean[r]) * rstd[r];
      acc_b += g;
    }
  }
  sg[threadIdx.y][threadIdx.x] = acc_g;
  sb[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && d < D) {
    T tg = 0, tb = 0;
    for (int k = 0; k < 8; ++k) {
      tg += sg[k][threadIdx.x];
      tb += sb[k][threadIdx.x];
    }
    partial_g[chunk * D + d] = tg;
    partial_b[chunk * D + d] = tb;
  }
}

template <class T>
__global__ void layer_norm_column_finish(const T* partial_g, const T* partial_b, int64_t chunks, int64_t D, T* dgamma,
                                         T* dbeta) {
  DUET_GRID_STRIDE(d, D) {
    T tg = 0, tb = 0;
    for (int64_t c = 0; c < chunks; ++c) {
      tg += partial_g[c * D + d];
      tb += partial_b[c * D + d];
    }
    if (dgamma) dgamma[d] = tg;
    if (dbeta) dbeta[d] = tb;
  }
}

template <class T>
__global__ void bn_eval_stats_kernel(const T* running_mean, const T* running_var, T* save_mean, T* save_invstd, int64_t C,
                                     double eps) {
  DUET_GRID_STRIDE(c, C) {
    save_mean[c] = running_mean[c];
    save_invstd[c] = static_cast<T>(1.0 / sqrt(double(running_var[c]) + eps));
  }
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(rows < math::kMaxBlocks ? rows : math::kMaxBlocks); }

}  // namespace

cudaError_t layer_norm(DType dt, const void* x, const void* gamma, const void* beta, void* y, void* mean, void* rstd,
                       int64_t rows, int64_t D, double eps, cudaStream_t s) {
  if (rows <= 0 || D <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, layer_norm_kernel<T><<<row_grid(rows), math::row_block(D), 0, s>>>(
                              static_cast<const T*>(x), static_cast<const T*>(gamma), static_cast<const T*>(beta),
                              static_cast<T*>(y), static_cast<T*>(mean), static_cast<T*>(rstd), rows, D, static_cast<T>(eps)));
  return launched();
}

size_t layer_norm_backward_workspace(DType dt, int64_t rows, int64_t D) {
  return 2 * static_cast<size_t>(ln_chunks(rows)) * static_cast<size_t>(D > 0 ? D : 0) * dtype_size(dt);
}

cudaError_t layer_norm_backward(DType dt, const void* dy, const void* x, const void* gamma, const void* mean,
                                const void* rstd, void* dx, void* dgamma, void* dbeta, int64_t rows, int64_t D,
                                void* workspace, cudaStream_t s) {
  if (D <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, {
    const T* pdy = static_cast<const T*>(dy);
    const T* px = static_cast<const T*>(x);
    const T* pmean = static_cast<const T*>(mean);
    const T* prstd = static_cast<const T*>(rstd);
    if (dx && rows > 0) {
      layer_norm_dx_kernel<T><<<row_grid(rows), math::row_block(D), 0, s>>>(pdy, px, static_cast<const T*>(gamma), pmean,
                                                                           prstd, static_cast<T*>(dx), rows, D);
      if (const cudaError_t e = launched(); e != cudaSuccess) return e;
    }
    if (dgamma || dbeta) {
      const int64_t chunks = ln_chunks(rows);
      T* pg = static_cast<T*>(workspace);
      T* pb = pg + chunks * D;
      if (chunks > 0) {
        const dim3 blocks(static_cast<unsigned>(math::ceil_div(D, 32)), static_cast<unsigned>(chunks));
        layer_norm_column_partials<T><<<blocks, dim3(32, 8), 0, s>>>(pdy, px, pmean, prstd, rows, D,
                                                                    ln_rows_per_chunk(rows), pg, pb);
        if (const cudaError_t e = launched(); e != cudaSuccess) return e;
      }
      layer_norm_column_finish<T><<<grid(D), math::kBlock, 0, s>>>(pg, pb, chunks, D, static_cast<T*>(dgamma),
                                                                  static_cast<T*>(dbeta));
    }
  });
  return launched();
}

cudaError_t batch_norm_eval_stats(DType dt, const void* running_mean, const void* running_var, void* save_mean,
                                  void* save_invstd, int64_t C, double eps, cudaStream_t s) {
  if (C <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, bn_eval_stats_kernel<T><<<grid(C), math::kBlock, 0, s>>>(
                              static_cast<const T*>(running_mean), static_cast<const T*>(running_var),
                              static_cast<T*>(save_mean), static_cast<T*>(save_invstd), C, eps));
  return launched();
}

}  // namespace duet::cuda::kern
