// Reductions without a permute: the host splits x's dims into kept and reduced ones and hands over
// one offset calculator for each, so any set of dims of any layout is reduced in place. How the
// work is spread (a block per output, 32-output column tiles, or a thread per output, and whether
// the reduced extent is split over several blocks with a second pass) is math::plan_reduce's
// choice, documented there. Accumulation is in acc_t<T> (float for f32, as cuDNN and PyTorch do;
// float for f16/bf16 too, which only conv2d's bias gradient sends here under autocast); partial
// results keep that type between the two passes. The tree order keeps f32 sums accurate to a few
// ulps of the double reference.
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
__device__ inline A finish(ReduceOp op, A acc, int64_t count) {
  return op == ReduceOp::mean ? acc / A(count) : acc;  // an empty mean is 0/0 = NaN, as in PyTorch
}

// What every reduction kernel gets: the input walk, where the outputs go, and whether this launch
// writes final results (`last`: a mean divides by `count`, the whole extent) or partials.
template <class In, class Out>
struct ReduceArgs {
  ReduceOp op;
  const In* x;
  OffsetCalc<1> kept, reduced;
  int64_t outputs, extent;
  math::ReducePlan plan;
  bool last;
  int64_t count;
  Out* out;  // [outputs, splits]: out[o * splits + split]
};

// Element r of the reduced walk of the output whose kept offset is `base`, widened.
template <class In, class Out>
__device__ inline acc_t<In> element(const ReduceArgs<In, Out>& a, int64_t base, int64_t r) {
  int64_t off[1];
  a.reduced.offsets(r, off);
  return acc_t<In>(widen(a.x[base + off[0]]));
}

template <class In, class Out, class A>
__device__ inline void store(const ReduceArgs<In, Out>& a, int64_t o, int64_t split, A acc) {
  a.out[o * a.plan.splits + split] = narrow<Out>(a.last ? finish(a.op, acc, a.count) : acc);
}

template <class In, class Out>
__global__ void reduce_rows_kernel(ReduceArgs<In, Out> a) {
  using A = acc_t<In>;
  DUET_SHARED_SCRATCH(A, scratch);
  int64_t r0 = 0, r1 = 0;
  math::reduce_split_range(a.plan, a.extent, blockIdx.y, r0, r1);
  for (int64_t o = blockIdx.x; o < a.outputs; o += gridDim.x) {
    int64_t base[1];
    a.kept.offsets(o, base);
    A acc = reduce_init<A>(a.op);
    for (int64_t r = r0 + threadIdx.x; r < r1; r += blockDim.x)
      acc = combine(a.op, acc, element(a, base[0], r));
    acc = block_reduce(a.op, acc, scratch);
    if (threadIdx.x == 0) store(a, o, blockIdx.y, acc);
  }
}

// Block (32, block_y): thread (tx, ty) reduces rows r0 + ty, r0 + ty + block_y, ... of output
// 32 * tile + tx, then the column of block_y partial results is combined through shared memory.
template <class In, class Out>
__global__ void reduce_columns_kernel(ReduceArgs<In, Out> a) {
  using A = acc_t<In>;
  __shared__ alignas(16) unsigned char tile_raw[16 * 33 * sizeof(double)];  // block_y <= 16; 33: no bank conflicts
  A* tile = reinterpret_cast<A*>(tile_raw);
  int64_t r0 = 0, r1 = 0;
  math::reduce_split_range(a.plan, a.extent, blockIdx.y, r0, r1);
  for (int64_t first = int64_t(blockIdx.x) * 32; first < a.outputs; first += int64_t(gridDim.x) * 32) {
    const int64_t o = first + threadIdx.x;
    A acc = reduce_init<A>(a.op);
    if (o < a.outputs) {
      int64_t base[1];
      a.kept.offsets(o, base);
      for (int64_t r = r0 + threadIdx.y; r < r1; r += blockDim.y)
        acc = combine(a.op, acc, element(a, base[0], r));
    }
    tile[threadIdx.y * 33 + threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && o < a.outputs) {
      for (int k = 1; k < int(blockDim.y); ++k) acc = combine(a.op, acc, tile[k * 33 + threadIdx.x]);
      store(a, o, blockIdx.y, acc);
    }
    __syncthreads();  // the tile is reused by the next 32 outputs
  }
}

template <class In, class Out>
__global__ void reduce_threads_kernel(ReduceArgs<In, Out> a) {
  using A = acc_t<In>;
  DUET_GRID_STRIDE(o, a.outputs) {
    int64_t base[1];
    a.kept.offsets(o, base);
    A acc = reduce_init<A>(a.op);
    for (int64_t r = 0; r < a.extent; ++r)
      acc = combine(a.op, acc, element(a, base[0], r));
    store(a, o, 0, acc);
  }
}

template <class In, class Out>
cudaError_t launch_reduce(const ReduceArgs<In, Out>& a, cudaStream_t s) {
  const math::ReducePlan& p = a.plan;
  const dim3 blocks(static_cast<unsigned>(p.blocks_x), static_cast<unsigned>(p.splits));
  switch (p.kind) {
    case math::ReducePlan::Kind::columns: reduce_columns_kernel<In, Out><<<blocks, dim3(32, p.block_y), 0, s>>>(a); break;
    case math::ReducePlan::Kind::rows: reduce_rows_kernel<In, Out><<<blocks, p.block_x, 0, s>>>(a); break;
    case math::ReducePlan::Kind::threads: reduce_threads_kernel<In, Out><<<blocks, p.block_x, 0, s>>>(a); break;
  }
  return launched();
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

size_t reduce_workspace(DType dt, const math::ReducePlan& plan, int64_t outputs) {
  if (plan.splits <= 1 || outputs <= 0) return 0;
  const size_t acc = dt == DType::f64 ? sizeof(double) : sizeof(float);
  return static_cast<size_t>(outputs) * static_cast<size_t>(plan.splits) * acc;
}

cudaError_t reduce(ReduceOp op, DType dt, const void* x, const OffsetCalc<1>& kept, const OffsetCalc<1>& reduced,
                   int64_t outputs, int64_t extent, const math::ReducePlan& plan, void* workspace, void* out,
                   cudaStream_t s) {
  if (outputs <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT_OR_HALF(dt, {
    using A = acc_t<T>;
    const T* px = static_cast<const T*>(x);
    T* po = static_cast<T*>(out);
    if (plan.splits <= 1) return launch_reduce(ReduceArgs<T, T>{op, px, kept, reduced, outputs, extent, plan, true, extent, po}, s);
    // Pass 1: partial results of every split; pass 2: each output's row of `splits` partials.
    A* partial = static_cast<A*>(workspace);
    if (const cudaError_t e = launch_reduce(ReduceArgs<T, A>{op, px, kept, reduced, outputs, extent, plan, false, extent, partial}, s);
        e != cudaSuccess)
      return e;
    OffsetCalc<1> pk, pr;
    pk.ndim = pr.ndim = 1;
    pk.sizes[0] = outputs, pk.strides[0][0] = plan.splits;
    pr.sizes[0] = plan.splits, pr.strides[0][0] = 1;
    const math::ReducePlan second = math::plan_reduce(outputs, plan.splits, plan.splits == 1, true, 0);
    return launch_reduce(ReduceArgs<A, T>{op, partial, pk, pr, outputs, plan.splits, second, true, extent, po}, s);
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
