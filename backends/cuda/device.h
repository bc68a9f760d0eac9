// Per-device state of the CUDA backend: one compute stream (every kernel, cuBLAS and cuDNN call of
// the device runs on it, in issue order), cuBLAS and cuDNN handles bound to that stream and created
// on first use, and the caching allocator. Also device discovery, which never throws: no driver or
// no GPU simply means zero devices, and the reason is kept for error messages.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <optional>
#include <string>
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/kernels.h"
#include "backends/cuda/pinned_staging.h"

namespace duet::cuda {

// Number of usable devices; 0 (never an exception, never a hang) without a driver or a GPU.
int device_count() noexcept;
// Why device_count() is 0, phrased for users ("no CUDA device: ..."); "" when devices exist.
std::string unavailable_reason();
// Throws duet::Error unless `index` names an existing device: "no CUDA device: <reason>" when
// there is none at all, else which indices exist.
void check_device(int index, const char* op);

class DeviceContext {
public:
  explicit DeviceContext(int index);
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int index() const { return index_; }
  int multiprocessors() const { return multiprocessors_; }  // the SM count, for launch planning
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas(const char* op);  // created on first use, bound to stream()
  cudnnHandle_t cudnn(const char* op);    // created on first use, bound to stream()
  CachingAllocator& allocator() { return *allocator_; }
  // Waits for the stream; then reports an invalid label a loss kernel has recorded since the last
  // wait (take_label_error) as a duet::Error.
  void synchronize(const char* op);
  // Waits for the stream and reports CUDA errors, leaving the label record to the next
  // synchronize(): for waits that must not raise a loss's error themselves (the profiler's timer).
  void wait(const char* op);
  // The device's view of its LabelError record (host-mapped pinned memory, created on first use).
  kern::LabelError* label_errors(const char* op);
  // Pinned staging blocks for host-to-device copies on this device's stream (pinned_staging.h).
  StagingBlocks& staging();

private:
  int index_;
  int multiprocessors_ = 1;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  CachingAllocator* allocator_ = nullptr;  // leaked on purpose, see device.cpp
  kern::LabelError* label_errors_host_ = nullptr;  // pinned and mapped; leaked likewise
  kern::LabelError* label_errors_device_ = nullptr;
  StagingBlocks* staging_ = nullptr;  // leaked likewise
};

// The error message of a pending record, which it clears; nullopt when none is pending. `where` is
// the call that waited (the error belongs to an earlier loss, not to it).
std::optional<std::string> take_label_error(kern::LabelError& record, const char* where);

// GPU time between two points of a device's stream, measured with CUDA events (the host clock
// would measure launch time, since kernels run asynchronously).
class StreamTimer {
public:
  explicit StreamTimer(DeviceContext& ctx);
  ~StreamTimer();
  StreamTimer(const StreamTimer&) = delete;
  StreamTimer& operator=(const StreamTimer&) = delete;
  void start();
  void stop();
  double elapsed_ms();  // waits for the stop event

private:
  DeviceContext& ctx_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// The context of a device, created on first use; makes the device current for the calling thread
// (cudaSetDevice), so every op calls this with its tensors' device before touching the GPU.
DeviceContext& context(int index, const char* op);
// The contexts created so far are synchronised (Backend::synchronize).
void synchronize_all(const char* op);
// The caching allocator of a device (without making it current).
CachingAllocator& allocator(int index);

}  // namespace duet::cuda
