// Reductions without a permute: the host splits x's dims into kept and reduced ones and hands over
// one offset calculator for each, so any set of dims of any layout is reduced in place. A result
// with much work gets a whole block (threads stride over the reduced elements, then a shuffle
// tree); many small results get one thread each. Accumulation is in T (float for f32, as cuDNN and
// PyTorch do; float for f16/bf16 too, which only conv2d's bias gradient sends here under
// autocast); the tree order keeps f32 sums accurate to a few ulps of the double reference.
#include "backends/cuda/kernels_common.cuh"

namespace duet::cuda::kern {

namespace {

template <class A>
__device__ inline A reduce_init(ReduceOp op) {
  if (op == ReduceOp::max) return -INFINITY;
  if (op == ReduceOp::min) return INFINITY;
  return A(0);
}

template <class A>
__device__ inline A combine(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::max: return math::max_nan(a, b);
    case ReduceOp::min: return math::min_nan(a, b);
    default: return a + b;
  }
}

template <class A>
__device__ inline A warp_reduce(ReduceOp op, A v) {
  for (int o = 16; o > 0; o >>= 1) v = combine(op, v, __shfl_down_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the block, valid in thread 0.
template <class A>
__device__ inline A block_reduce(ReduceOp op, A v, A* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(op, v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = int(threadIdx.x) < warps ? scratch[lane] : reduce_init<A>(op);
  if (warp == 0) v = warp_reduce(op, v);
  __syncthreads();  // scratch is reused by the next output of this block
  return v;
}

template <class A>
__device__ inline A finish(ReduceOp op, A acc, int64_t extent) {
  return op == ReduceOp::mean ? acc / A(extent) : acc;  // an empty mean is 0/0 = NaN, as in PyTorch
}

template <class T>
__global__ void reduce_block_kernel(ReduceOp op, const T* x, OffsetCalc<1> kept, OffsetCalc<1> reduced, int64_t outputs,
                                    int64_t extent, T* out) {
  using A = acc_t<T>;
  DUET_SHARED_SCRATCH(A, scratch);
  for (int64_t o = blockIdx.x; o < outputs; o += gridDim.x) {
    int64_t base[1];
    kept.offsets(o, base);
    A acc = reduce_init<A>(op);
    for (int64_t r = threadIdx.x; r < extent; r += blockDim.x) {
      int64_t off[1];
      reduced.offsets(r, off);
      acc = combine(op, acc, A(widen(x[base[0] + off[0]])));
    }
    acc = block_reduce(op, acc, scratch);
    if (threadIdx.x == 0) out[o] = narrow<T>(finish(op, acc, extent));
  }
}

template <class T>
__global__ void reduce_thread_kernel(ReduceOp op, const T* x, OffsetCalc<1> kept, OffsetCalc<1> reduced,
                                     int64_t outputs, int64_t extent, T* out) {
  using A = acc_t<T>;
  DUET_GRID_STRIDE(o, outputs) {
    int64_t base[1];
    kept.offsets(o, base);
    A acc = reduce_init<A>(op);
    for (int64_t r = 0; r < extent; ++r) {
      int64_t off[1];
      reduced.offsets(r, off);
      acc = combine(op, acc, A(widen(x[base[0] + off[0]])));
    }
    out[o] = narrow<T>(finish(op, acc, extent));
  }
}

// The first maximum along the line; a NaN counts as larger than everything, so the first NaN wins.
template <class T>
__global__ void argmax_kernel(const T* x, int64_t outer, int64_t len, int64_t inner, int64_t* out) {
  DUET_GRID_STRIDE(i, outer * inner) {
    const int64_t o = i / inner, in = i % inner;
    const T* line = x + o * len * inner + in;
    int64_t best_i = 0;
    T best = line[0];
    for (int64_t k = 1; k < len && !math::is_nan(best); ++k) {
      const T v = line[k * inner];
      if (math::is_nan(v) || v > best) {
        best = v;
        best_i = k;
      }
    }
    out[i] = best_i;
  }
}

}  // namespace

cudaError_t reduce(ReduceOp op, DType dt, const void* x, const OffsetCalc<1>& kept, const OffsetCalc<1>& reduced,
                   int64_t outputs, int64_t extent, void* out, cudaStream_t s) {
  if (outputs <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT_OR_HALF(dt, {
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    if (math::reduce_block_per_output(outputs, extent)) {
      const int block = math::row_block(extent);
      const unsigned blocks = static_cast<unsigned>(outputs < math::kMaxBlocks ? outputs : math::kMaxBlocks);
      reduce_block_kernel<T><<<blocks, block, 0, s>>>(op, px, kept, reduced, outputs, extent, po);
    } else {
      reduce_thread_kernel<T><<<grid(outputs), math::kBlock, 0, s>>>(op, px, kept, reduced, outputs, extent, po);
    }
  });
  return launched();
}

cudaError_t argmax(DType dt, const void* x, int64_t outer, int64_t len, int64_t inner, int64_t* out, cudaStream_t s) {
  const int64_t n = outer * inner;
  if (n <= 0 || len <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, argmax_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<const T*>(x), outer, len, inner, out));
  return launched();
}

}  // namespace duet::cuda::kern
