// cudaEvent recording and resolution for the profiler's per-op timing (see event_timer.h): the
// CUDA runtime's side of event_timer_core.h, whose logic is tested without a GPU.
#include "backends/cuda/event_timer.h"
#include <vector>
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/event_timer_core.h"
#include "engine/profiler/events.h"

namespace duet::cuda {

namespace {

constexpr const char* kOp = "profiler event timing";

// One cudaEvent_t per slot of each device's pool, created when the slot is first recorded into.
class CudaEvents {
public:
  int device_count() { return cuda::device_count(); }
  int current_device() {
    int i = 0;
    DUET_CUDA_CHECK(cudaGetDevice(&i), kOp);
    return i;
  }
  int64_t now_ns() { return profiler::now_ns(); }
  bool stream_busy(int i) { return cuda::stream_busy(context(i, kOp).stream(), kOp); }
  // DeviceContext::wait, not synchronize: synchronize also takes a loss's label record.
  void wait_for_stream(int i) { context(i, kOp).wait(kOp); }
  void record(int i, int slot) {
    DeviceContext& ctx = context(i, kOp);
    cudaEvent_t& e = event(i, slot);
    if (!e) DUET_CUDA_CHECK(cudaEventCreate(&e), kOp);  // default flags keep timing enabled
    DUET_CUDA_CHECK(cudaEventRecord(e, ctx.stream()), kOp);
  }
  void wait_event(int i, int slot) {
    DUET_CUDA_CHECK(cudaSetDevice(i), kOp);
    DUET_CUDA_CHECK(cudaEventSynchronize(event(i, slot)), kOp);
  }
  double elapsed_ms(int i, int from, int to) {
    float ms = 0;
    DUET_CUDA_CHECK(cudaEventElapsedTime(&ms, event(i, from), event(i, to)), kOp);
    return ms;
  }

private:
  cudaEvent_t& event(int i, int slot) {
    if (static_cast<size_t>(i) >= events_.size()) events_.resize(static_cast<size_t>(i) + 1);
    std::vector<cudaEvent_t>& pool = events_[static_cast<size_t>(i)];
    if (static_cast<size_t>(slot) >= pool.size()) pool.resize(static_cast<size_t>(slot) + 1, nullptr);
    return pool[static_cast<size_t>(slot)];
  }
  std::vector<std::vector<cudaEvent_t>> events_;
};

}  // namespace

profiler::DeviceTimer& event_timer() {
  static auto* t = new EventTimerCore<CudaEvents>;  // never destroyed, see event_timer.h
  return *t;
}

}  // namespace duet::cuda
