// The `cuda` backend: one override per op of engine/ops.def. Compute-bound ops go to cuDNN
// (convolution, batch norm, pooling, softmax) and cuBLAS (matmul, linear); everything
// memory-bound runs duet's own kernels (kernels_*.cu). All of a device's work is queued on one
// stream, so ops return before the GPU finishes; synchronize(), a copy to the host or .item()
// wait for it. docs/cuda_backend.md maps every op to the library call or kernel that runs it.
#pragma once
#include <cstdint>
#include "backends/cuda/device.h"
#include "backends/cuda/indexing.h"
#include "backends/cuda/kernels.h"
#include "engine/backend.h"

namespace duet {

class CudaBackend final : public BackendImpl {
public:
  Backend kind() const override { return Backend::cuda; }
  // f32 and f64 everywhere; the 16-bit types in the ops autocast sends here (conv2d, matmul,
  // linear) and in the copies that cast to and from them; any dtype in copies and fills.
  DTypeSupport support(OpId op, DType dt) const override;
  void synchronize() override;

#define DUET_OP(name, params, ...) void name params override;
#include "engine/ops.def"
#undef DUET_OP
};

// TF32 tensor-core maths for f32 convolutions and matmuls (Ampere and newer): about 8x the
// throughput at a 10-bit mantissa. Off by default so results match the reference backend to f32
// precision; DUET_CUDA_ALLOW_TF32=1 in the environment turns it on at start-up.
void cuda_set_allow_tf32(bool allow);
bool cuda_allow_tf32();

// Benchmark mode for convolutions, like torch.backends.cudnn.benchmark: the first time a problem
// (shapes, layout, dtype, padding...) is seen, cuDNN times its algorithms on the real tensors
// (cudnnFind*AlgorithmEx) and the fastest that runs is cached, instead of the heuristics' first
// choice. Pays off when shapes repeat (training with a fixed batch size); a few hundred
// milliseconds per new shape. Off by default; DUET_CUDNN_BENCHMARK=1 turns it on at start-up.
void cuda_set_cudnn_benchmark(bool on);
bool cuda_cudnn_benchmark();

// Gives the caching allocator's unused blocks back to the driver (all devices when device < 0),
// e.g. before another process needs the GPU; returns the bytes released. Waits for the device.
size_t cuda_release_cached(int device = -1);

// What backends/registry.cpp adds to the engine's table: the backend object, each device's caching
// allocator and the device count (0 when no driver or no device).
BackendImpl& cuda_backend();
Allocator& cuda_allocator(int device);
int cuda_device_count();

}  // namespace duet

namespace duet::cuda {

// Opened at the top of every op: checks that `t` lives on a CUDA device that exists, makes that
// device current and hands out its stream and handles. While the profiler records with
// profiler::sync_per_op() (--profile-sync), the op waits for its kernels on the way out, so the
// host-side timestamps measure GPU time rather than launch time; otherwise the profiler times ops
// with CUDA events (event_timer.h) and nothing waits here. With DUET_CUDA_SYNC=1 in the environment
// (a debug switch, like CUDA_LAUNCH_BLOCKING=1) every op waits and checks its kernels on the way
// out, so an asynchronous fault is reported under the op that caused it, not at a later
// synchronisation under another op's name.
bool sync_every_op();  // DUET_CUDA_SYNC=1, read once

class OpGuard {
public:
  OpGuard(const char* op, const Tensor& t);
  ~OpGuard() noexcept(false);
  OpGuard(const OpGuard&) = delete;
  OpGuard& operator=(const OpGuard&) = delete;

  DeviceContext& ctx;
  const char* op;
  cudaStream_t stream() const { return ctx.stream(); }
  int device() const { return ctx.index(); }
};

// Scratch memory from the device's caching allocator (tagged workspace), given back when the
// scope ends. Work queued on the stream before that point still sees valid memory: a later user
// of the block is queued behind it on the same stream.
class Workspace {
public:
  Workspace(DeviceContext& ctx, size_t bytes);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return p_; }
  size_t bytes() const { return bytes_; }

private:
  CachingAllocator& alloc_;
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// out (contiguous) = `op` of x over the dims where `reduced` is not 1, keeping those where `kept`
// is not 1 (each shape is x's sizes with the other dims set to 1): any layout, no permuted copy.
// Shared by the reduction ops and conv2d's bias gradient.
void reduce_strided(OpGuard& g, ReduceOp op, const Tensor& x, const Shape& kept, const Shape& reduced, const Tensor& out);

// Argument checks the front-ends do not make because they depend on this backend's limits (the
// dtypes it takes are declared once, in CudaBackend::support, and checked by the dispatch).
void check_on(const char* op, const char* arg, const Tensor& t, int device);

// Offset calculator for `shape` walked through each operand's strides; throws when more than
// kMaxDims dims remain after merging.
template <int N>
OffsetCalc<N> offset_calc(const char* op, const Shape& shape, const Shape* const (&strides)[N]);
extern template OffsetCalc<1> offset_calc<1>(const char*, const Shape&, const Shape* const (&)[1]);
extern template OffsetCalc<2> offset_calc<2>(const char*, const Shape&, const Shape* const (&)[2]);
extern template OffsetCalc<3> offset_calc<3>(const char*, const Shape&, const Shape* const (&)[3]);

// One flat span of n unit-stride elements.
OffsetCalc<1> flat_calc(int64_t n);

// Sizes and strides of a 4-D tensor, or of a 2-D [N, C] one read as [N, C, 1, 1].
kern::Dims4 dims4(const Tensor& t);
// True when a 4-D tensor is laid out channels-last (and not also plainly contiguous).
bool channels_last(const Tensor& t);
// t itself when contiguous, else a contiguous copy on the same device.
Tensor contiguous(const Tensor& t);
// Narrowing to int for cuDNN/cuBLAS arguments, with an error naming the op when it does not fit.
int to_int(const char* op, const char* what, int64_t v);

}  // namespace duet::cuda
