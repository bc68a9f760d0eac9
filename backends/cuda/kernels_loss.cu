// Cross-entropy with label smoothing, fused: one block per row computes the row's max, its
// log-sum-exp and the sum of its logits with shuffle reductions, so logits are read twice and no
// log-softmax tensor is materialised. The mean over rows is a second single-block kernel (a fixed
// summation order: the loss is bitwise reproducible run to run). Labels are checked on the device:
// the smallest offending row is found with atomicMin, and one thread copies it, with its label, into
// the device's LabelError record in host-mapped memory, which the host reports as a duet::Error at
// its next synchronisation (PyTorch stops the process with a device-side assert instead).
#include "backends/cuda/kernels_common.cuh"

namespace duet::cuda::kern {

namespace {

// Row statistics shared by forward and backward: the log-sum-exp and (forward only) the sum.
template <class T>
__device__ inline T row_lse(const T* row, int64_t C, T* scratch) {
  T mx = -INFINITY;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) mx = math::max_nan(mx, row[c]);
  mx = block_max(mx, scratch, T(-INFINITY));
  T se = 0;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) se += math::k_exp(row[c] - mx);
  return mx + math::k_log(block_sum(se, scratch));
}

template <class T>
__global__ void ce_rows_kernel(const T* logits, const int64_t* target, T* row_loss, int64_t N, int64_t C, T ls,
                               unsigned long long* bad_row) {
  DUET_SHARED_SCRATCH(T, scratch);
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int64_t t = target[i];
    if (t < 0 || t >= C) {  // the same t for the whole block, so the branch is uniform
      if (threadIdx.x == 0) {
        atomicMin(bad_row, static_cast<unsigned long long>(i));
        row_loss[i] = T(0);
      }
      continue;
    }
    const T* row = logits + i * C;
    const T lse = row_lse(row, C, scratch);
    T sx = 0;
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x) sx += row[c];
    sx = block_sum(sx, scratch);
    if (threadIdx.x == 0) row_loss[i] = math::cross_entropy_row(lse, row[t], sx, C, ls);
  }
}

template <class T>
__global__ void mean_kernel(const T* v, int64_t n, T* out) {
  DUET_SHARED_SCRATCH(T, scratch);
  T acc = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc += v[i];
  acc = block_sum(acc, scratch);
  if (threadIdx.x == 0) out[0] = acc / T(n);
}

template <class T>
__global__ void ce_backward_kernel(const T* logits, const int64_t* target, const T* dloss, T* dlogits, int64_t N, int64_t C,
                                   T ls, unsigned long long* bad_row) {
  DUET_SHARED_SCRATCH(T, scratch);
  const T scale = dloss[0] / T(N);
  for (int64_t i = blockIdx.x; i < N; i += gridDim.x) {
    const int64_t t = target[i];
    T* drow = dlogits + i * C;
    if (t < 0 || t >= C) {
      if (threadIdx.x == 0) atomicMin(bad_row, static_cast<unsigned long long>(i));
      for (int64_t c = threadIdx.x; c < C; c += blockDim.x) drow[c] = T(0);
      continue;
    }
    const T* row = logits + i * C;
    const T lse = row_lse(row, C, scratch);
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      drow[c] = math::cross_entropy_grad(math::k_exp(row[c] - lse), c == t, C, ls, scale);
  }
}

// One thread: the first invalid label of this launch goes to the record, unless one is pending.
__global__ void record_label_error_kernel(const unsigned long long* bad_row, const int64_t* target, int64_t C,
                                          LabelError* errors) {
  const unsigned long long row = *bad_row;
  if (row == ~0ull || errors->pending) return;
  errors->row = static_cast<int64_t>(row);
  errors->label = target[row];
  errors->classes = C;
  __threadfence_system();  // the fields reach the host before the flag that says they are there
  errors->pending = 1;
}

cudaError_t record_label_error(const unsigned long long* bad_row, const int64_t* target, int64_t C, LabelError* errors,
                               cudaStream_t s) {
  record_label_error_kernel<<<1, 1, 0, s>>>(bad_row, target, C, errors);
  return launched();
}

unsigned row_grid(int64_t rows) { return static_cast<unsigned>(rows < math::kMaxBlocks ? rows : math::kMaxBlocks); }

}  // namespace

size_t cross_entropy_workspace(DType dt, int64_t N) { return static_cast<size_t>(N > 0 ? N : 0) * dtype_size(dt); }

cudaError_t cross_entropy(DType dt, const void* logits, const int64_t* target, void* loss, int64_t N, int64_t C,
                          double label_smoothing, void* workspace, unsigned long long* bad_row, LabelError* errors,
                          cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, {
    T* rows = static_cast<T*>(workspace);
    ce_rows_kernel<T><<<row_grid(N), math::row_block(C), 0, s>>>(static_cast<const T*>(logits), target, rows, N, C,
                                                                 static_cast<T>(label_smoothing), bad_row);
    if (const cudaError_t e = launched(); e != cudaSuccess) return e;
    mean_kernel<T><<<1, 1024, 0, s>>>(rows, N, static_cast<T*>(loss));
  });
  if (const cudaError_t e = launched(); e != cudaSuccess) return e;
  return record_label_error(bad_row, target, C, errors, s);
}

cudaError_t cross_entropy_backward(DType dt, const void* logits, const int64_t* target, const void* dloss, void* dlogits,
                                   int64_t N, int64_t C, double label_smoothing, unsigned long long* bad_row,
                                   LabelError* errors, cudaStream_t s) {
  if (N <= 0 || C <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, ce_backward_kernel<T><<<row_grid(N), math::row_block(C), 0, s>>>(
                              static_cast<const T*>(logits), target, static_cast<const T*>(dloss), static_cast<T*>(dlogits),
                              N, C, static_cast<T>(label_smoothing), bad_row));
  if (const cudaError_t e = launched(); e != cudaSuccess) return e;
  return record_label_error(bad_row, target, C, errors, s);
}

}  // namespace duet::cuda::kern
