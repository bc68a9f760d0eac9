// The backend object, what the registry adds to the engine (cuda_backend, cuda_allocator, cuda_device_count)
// and the helpers every op of this backend shares: the per-op guard that selects the device, scratch
// workspaces from the caching allocator, and the launch-plan checks.
#include "backends/cuda/cuda_backend.h"
#include <atomic>
#include <cstdlib>
#include <exception>
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/event_timer.h"
#include "engine/half.h"
#include "engine/profiler/events.h"
#include "engine/profiler/device_timer.h"

namespace duet {

namespace {
bool env_on(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && env[0] == '1';
}
std::atomic<bool>& tf32_flag() {
  static std::atomic<bool> flag{env_on("DUET_CUDA_ALLOW_TF32")};
  return flag;
}
std::atomic<bool>& benchmark_flag() {
  static std::atomic<bool> flag{env_on("DUET_CUDNN_BENCHMARK")};
  return flag;
}
}  // namespace

void cuda_set_allow_tf32(bool allow) { tf32_flag().store(allow); }
bool cuda_allow_tf32() { return tf32_flag().load(std::memory_order_relaxed); }

void cuda_set_cudnn_benchmark(bool on) { benchmark_flag().store(on); }
bool cuda_cudnn_benchmark() { return benchmark_flag().load(std::memory_order_relaxed); }

size_t cuda_release_cached(int device) {
  if (device >= 0) cuda::check_device(device, "cuda_release_cached");
  size_t released = 0;
  for (int d = 0; d < cuda::device_count(); ++d)
    if (device < 0 || d == device) released += cuda::allocator(d).release_cached();
  return released;
}

void CudaBackend::synchronize() { cuda::synchronize_all("synchronize"); }

// The one place that says which dtypes the GPU kernels take (the dispatch refuses the rest before
// any work, and the op table skips cases that would reach them). The own kernels are instantiated
// for f32 and f64 (kernels_common.cuh's DUET_DISPATCH_FLOAT); cuDNN's convolutions and cuBLAS's
// products also run f16 and bf16 with f32 accumulation, which is what autocast uses; the copy kernel
// converts between all seven dtypes.
DTypeSupport CudaBackend::support(OpId op, DType dt) const {
  if (op == OpId::copy || op == OpId::fill || op == OpId::concat) return {};
  if (dt == DType::f32 || dt == DType::f64) return {};
  const bool mixed_precision_op =
      op == OpId::conv2d || op == OpId::conv2d_backward || op == OpId::matmul || op == OpId::linear;
  if (is_half(dt) && mixed_precision_op) return {};
  return {Coverage::refused, is_half(dt) ? "16-bit types run only in conv2d, matmul and linear on the GPU (what autocast "
                                           "sends there); the other ops take f32 or f64"
                                         : "expected f32 or f64"};
}

// ---- what backends/registry.cpp registers --------------------------------------------------------------
BackendImpl& cuda_backend() {
  static CudaBackend b;
  // Every op reaches this function before its profiler scope opens, so the profiler times CUDA ops
  // with events from the first one on.
  static const bool timer_registered = [] {
    profiler::set_device_timer(Backend::cuda, &cuda::event_timer());
    return true;
  }();
  (void)timer_registered;
  return b;
}

Allocator& cuda_allocator(int device) { return cuda::allocator(device); }

int cuda_device_count() { return cuda::device_count(); }

}  // namespace duet

namespace duet::cuda {

OpGuard::OpGuard(const char* op_name, const Tensor& t)
    : ctx([&]() -> DeviceContext& {
        DUET_CHECK(t.defined(), "{} on backend 'cuda': an argument is an undefined tensor", op_name);
        DUET_CHECK(t.device().type == DeviceType::cuda, "{} on backend 'cuda': tensor is on {}, expected a cuda device",
                   op_name, t.device().str());
        return context(t.device().index, op_name);
      }()),
      op(op_name) {}

bool sync_every_op() {
  static const bool on = [] {
    const char* env = std::getenv("DUET_CUDA_SYNC");
    return env != nullptr && env[0] == '1';
  }();
  return on;
}

OpGuard::~OpGuard() noexcept(false) {
  // The host-clock scheme (--profile-sync) and the DUET_CUDA_SYNC=1 debug switch wait per op; event
  // timing needs no wait here.
  const bool debug = sync_every_op();
  if (!debug && (!profiler::enabled() || !profiler::sync_per_op())) return;
  // Never throw while another exception is already unwinding the stack (that would terminate).
  if (std::uncaught_exceptions() > 0) return;
  // A launch error is still pending as the last error; a fault inside a kernel surfaces at the wait.
  cudaError_t e = debug ? cudaGetLastError() : cudaSuccess;
  if (e == cudaSuccess) e = cudaStreamSynchronize(ctx.stream());
  if (e != cudaSuccess)
    throw_cuda_error(e, debug ? "DUET_CUDA_SYNC=1: synchronise after the op" : "cudaStreamSynchronize", op, __FILE__,
                     __LINE__);
}

Workspace::Workspace(DeviceContext& ctx, size_t bytes) : alloc_(ctx.allocator()), bytes_(bytes) {
  if (bytes_ > 0) p_ = alloc_.allocate(bytes_, MemTag::workspace);
}

Workspace::~Workspace() {
  if (p_) alloc_.deallocate(p_, bytes_, MemTag::workspace);
}

void check_on(const char* op, const char* arg, const Tensor& t, int device) {
  DUET_CHECK(t.device() == Device::cuda(device), "{} on backend 'cuda': argument '{}' is on {}, expected cuda:{}", op, arg,
             t.device().str(), device);
}

template <int N>
OffsetCalc<N> offset_calc(const char* op, const Shape& shape, const Shape* const (&strides)[N]) {
  OffsetCalc<N> c;
  DUET_CHECK(make_offset_calc<N>(shape, strides, c),
             "{} on backend 'cuda': shape {} has more than {} dims that cannot be merged (strides {}); make the tensor "
             "contiguous first",
             op, shape_str(shape), kMaxDims, shape_str(*strides[N - 1]));
  return c;
}
template OffsetCalc<1> offset_calc<1>(const char*, const Shape&, const Shape* const (&)[1]);
template OffsetCalc<2> offset_calc<2>(const char*, const Shape&, const Shape* const (&)[2]);
template OffsetCalc<3> offset_calc<3>(const char*, const Shape&, const Shape* const (&)[3]);

OffsetCalc<1> flat_calc(int64_t n) {
  OffsetCalc<1> c;
  c.ndim = 1;
  c.sizes[0] = n;
  c.strides[0][0] = 1;
  return c;
}

kern::Dims4 dims4(const Tensor& t) {
  kern::Dims4 d;
  const Shape& s = t.shape();
  const Shape& st = t.strides();
  DUET_CHECK(s.size() == 4 || s.size() == 2, "backend 'cuda': expected a 4-D [N, C, H, W] or 2-D [N, C] tensor, got {}",
             shape_str(s));
  d.N = s[0], d.C = s[1], d.sN = st[0], d.sC = st[1];
  if (s.size() == 4) d.H = s[2], d.W = s[3], d.sH = st[2], d.sW = st[3];
  return d;
}

bool channels_last(const Tensor& t) {
  return t.dim() == 4 && !t.is_contiguous() && t.is_contiguous(MemoryFormat::channels_last);
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : t.contiguous(); }

int to_int(const char* op, const char* what, int64_t v) {
  DUET_CHECK(v >= 0 && v <= INT32_MAX, "{} on backend 'cuda': {} = {} does not fit the 32-bit int that cuDNN/cuBLAS take",
             op, what, v);
  return static_cast<int>(v);
}

}  // namespace duet::cuda
