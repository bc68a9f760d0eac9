// Device discovery, per-device contexts (stream, cuBLAS/cuDNN handles) and the cudaMalloc source
// of the caching allocators. Contexts and allocators are created on first use and deliberately
// never destroyed: tensors held in static objects are freed during exit, possibly after the CUDA
// runtime has shut down, and a destroyed allocator or handle would turn that into a crash.
#include "backends/cuda/device.h"
#include <cstdio>
#include <mutex>
#include <new>
#include <vector>
#include "backends/cuda/arch_support.h"
#include "backends/cuda/cublas_library.h"
#include "backends/cuda/cuda_check.h"
#include "engine/error.h"

namespace duet::cuda {

namespace {

struct Discovery {
  int count = 0;
  std::string reason;
};

std::string describe_failure(cudaError_t e) {
  int driver = 0, runtime = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  switch (e) {
    case cudaErrorInsufficientDriver:
      if (driver == 0) return "no NVIDIA driver is installed (libcuda.so.1 was not found)";
      return fmt::format("the NVIDIA driver supports {}, older than the {} runtime this build uses: update the driver",
                         cuda_version_str(driver), cuda_version_str(runtime));
    case cudaErrorNoDevice: return "the driver found no GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES)";
    case cudaErrorStubLibrary: return "libcuda.so is the CUDA Toolkit's stub library, not a driver: install the NVIDIA driver";
    default:
      return fmt::format("cudaGetDeviceCount failed with {} ({})", cudaGetErrorName(e), cudaGetErrorString(e));
  }
}

Discovery discover() noexcept {
  Discovery d;
  try {
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      d.reason = describe_failure(e);
      return d;
    }
    d.count = n;
    if (n == 0) d.reason = "the driver reports no GPU";
  } catch (...) {
    d.count = 0;
    d.reason = "device discovery failed";
  }
  return d;
}

// Devices do not come and go while a process runs, so discovery happens once.
const Discovery& discovery() noexcept {
  static const Discovery d = discover();
  return d;
}

// cudaMalloc/cudaFree for one device. An exhausted device yields nullptr so that the caching
// allocator can release its cache and retry; any other failure is an error.
class CudaMemorySource final : public RawMemorySource {
public:
  explicit CudaMemorySource(int device) : device_(device) {}

  void* raw_alloc(size_t bytes) override {
    int prev = -1;
    DUET_CUDA_CHECK(cudaGetDevice(&prev), "cudaMalloc");
    DUET_CUDA_CHECK(cudaSetDevice(device_), "cudaMalloc");
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (prev != device_) (void)handled(cudaSetDevice(prev));  // an op may allocate on another device than its own
    if (e == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: clear it so the next kernel launch check is clean
      return nullptr;
    }
    DUET_CUDA_CHECK(e, "cudaMalloc");
    return p;
  }

  // cudaFree also waits for the device, but only as an implementation detail; this makes the
  // ordering explicit. Reports rather than throws: it may run on an error path.
  void before_release() override {
    int prev = -1;
    (void)handled(cudaGetDevice(&prev));
    (void)handled(cudaSetDevice(device_));
    if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "duet: cudaDeviceSynchronize on cuda:%d failed: %s\n", device_, cudaGetErrorString(e));
    }
    if (prev >= 0 && prev != device_) (void)handled(cudaSetDevice(prev));
  }

  // Runs while the caching allocator releases its cache, possibly during an error path: reports
  // rather than throws.
  void raw_free(void* p, size_t bytes) override {
    int prev = -1;
    (void)handled(cudaGetDevice(&prev));
    (void)handled(cudaSetDevice(device_));
    const cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "duet: cudaFree of %zu bytes on cuda:%d failed: %s\n", bytes, device_, cudaGetErrorString(e));
    }
    if (prev >= 0 && prev != device_) (void)handled(cudaSetDevice(prev));
  }

  std::optional<Info> info() override {
    int prev = -1;
    (void)handled(cudaGetDevice(&prev));
    if (cudaSetDevice(device_) != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    Info i;
    const cudaError_t e = cudaMemGetInfo(&i.free, &i.total);
    if (prev >= 0 && prev != device_) (void)handled(cudaSetDevice(prev));
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return std::nullopt;
    }
    return i;
  }

private:
  int device_;
};

std::mutex g_mu;
std::vector<DeviceContext*>& contexts() {
  static std::vector<DeviceContext*> v;
  return v;
}
std::vector<CachingAllocator*>& allocators() {
  static std::vector<CachingAllocator*> v;
  return v;
}

}  // namespace

int device_count() noexcept { return discovery().count; }

std::string unavailable_reason() {
  const Discovery& d = discovery();
  return d.count > 0 ? std::string() : "no CUDA device: " + d.reason;
}

void check_device(int index, const char* op) {
  const Discovery& d = discovery();
  if (d.count == 0) throw Error(fmt::format("{}: {}", op, unavailable_reason()));
  DUET_CHECK(index >= 0 && index < d.count, "{}: device cuda:{} does not exist: this machine has {} CUDA device{} (cuda:0{})",
             op, index, d.count, d.count == 1 ? "" : "s", d.count == 1 ? "" : fmt::format(" to cuda:{}", d.count - 1));
}

CachingAllocator& allocator(int index) {
  check_device(index, "cuda allocator");
  std::lock_guard<std::mutex> lk(g_mu);
  auto& v = allocators();
  if (v.empty()) v.assign(static_cast<size_t>(device_count()), nullptr);
  CachingAllocator*& a = v[static_cast<size_t>(index)];
  if (!a) a = new CachingAllocator(fmt::format("cuda:{}", index), std::make_unique<CudaMemorySource>(index));
  return *a;
}

DeviceContext::DeviceContext(int index) : index_(index) {
  DUET_CUDA_CHECK(cudaSetDevice(index), "cuda device setup");
  cudaDeviceProp p{};
  DUET_CUDA_CHECK(cudaGetDeviceProperties(&p, index), "cuda device setup");
  DUET_CHECK(arch_supported(p.major, p.minor, built_archs()),
             "cuda:{} is a {} (compute capability {}.{}), and this duet has GPU code only for CUDA architectures '{}': "
             "rebuild with -DCMAKE_CUDA_ARCHITECTURES=native (or add {}{}-real to the list)",
             index, p.name, p.major, p.minor, built_archs(), p.major, p.minor);
  multiprocessors_ = p.multiProcessorCount > 0 ? p.multiProcessorCount : 1;
  // Non-blocking: the legacy default stream would otherwise serialise against this one.
  DUET_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cuda device setup");
  allocator_ = &cuda::allocator(index);
}

cublasHandle_t DeviceContext::cublas(const char* op) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!cublas_) {
    const CublasLibrary& blas = cublas_library(op);
    cublasHandle_t h = nullptr;
    DUET_CUBLAS_CHECK(blas.cublasCreate(&h), op);
    DUET_CUBLAS_CHECK(blas.cublasSetStream(h, stream_), op);
    cublas_ = h;
  }
  return cublas_;
}

cudnnHandle_t DeviceContext::cudnn(const char* op) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!cudnn_) {
    cudnnHandle_t h = nullptr;
    DUET_CUDNN_CHECK(cudnnCreate(&h), op);
    DUET_CUDNN_CHECK(cudnnSetStream(h, stream_), op);
    cudnn_ = h;
  }
  return cudnn_;
}

void DeviceContext::wait(const char* op) { DUET_CUDA_CHECK(cudaStreamSynchronize(stream_), op); }

void DeviceContext::synchronize(const char* op) {
  wait(op);
  if (label_errors_host_)
    if (std::optional<std::string> message = take_label_error(*label_errors_host_, op)) throw Error(*message);
}

kern::LabelError* DeviceContext::label_errors(const char* op) {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!label_errors_device_) {
    void* host = nullptr;
    DUET_CUDA_CHECK(cudaHostAlloc(&host, sizeof(kern::LabelError), cudaHostAllocMapped), op);
    label_errors_host_ = new (host) kern::LabelError{};
    void* device = nullptr;
    DUET_CUDA_CHECK(cudaHostGetDevicePointer(&device, host, 0), op);
    label_errors_device_ = static_cast<kern::LabelError*>(device);
  }
  return label_errors_device_;
}

namespace {

// The CUDA calls behind the staging blocks of one device's stream.
class CudaStagingRuntime final : public StagingRuntime {
public:
  explicit CudaStagingRuntime(cudaStream_t s) : stream_(s) {}
  void* allocate(size_t bytes) override {
    void* p = nullptr;
    return handled(cudaHostAlloc(&p, bytes, cudaHostAllocDefault)) == cudaSuccess ? p : nullptr;
  }
  void release(void* p) override { DUET_CUDA_CHECK(cudaFreeHost(p), kOp); }
  void* new_event() override {
    cudaEvent_t e = nullptr;
    DUET_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), kOp);
    return e;
  }
  void record(void* e) override { DUET_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e), stream_), kOp); }
  bool finished(void* e) override {
    const cudaError_t st = handled(cudaEventQuery(static_cast<cudaEvent_t>(e)));
    if (st == cudaErrorNotReady) return false;
    DUET_CUDA_CHECK(st, kOp);
    return true;
  }
  void wait(void* e) override { DUET_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e)), kOp); }

private:
  static constexpr const char* kOp = "copy (pinned staging)";
  cudaStream_t stream_;
};

// Pinned memory a device's staging may hold; a bigger copy goes from pageable memory and waits.
constexpr size_t kStagingLimit = size_t(256) << 20;

}  // namespace

StagingBlocks& DeviceContext::staging() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (!staging_) staging_ = new StagingBlocks(*new CudaStagingRuntime(stream_), kStagingLimit);
  return *staging_;
}

std::optional<std::string> take_label_error(kern::LabelError& record, const char* where) {
  if (!record.pending) return std::nullopt;
  const kern::LabelError e = record;
  record = kern::LabelError{};
  return fmt::format(
      "cross_entropy: target[{}] = {} is not a valid class label, expected 0 <= label < {} (found on the GPU by an "
      "earlier cross_entropy and reported at the next synchronisation, in {})",
      e.row, e.label, e.classes, where);
}

DeviceContext& context(int index, const char* op) {
  check_device(index, op);
  DeviceContext* ctx = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    auto& v = contexts();
    if (v.empty()) v.assign(static_cast<size_t>(device_count()), nullptr);
    ctx = v[static_cast<size_t>(index)];
  }
  if (!ctx) {
    auto* fresh = new DeviceContext(index);  // outside the lock: it takes the allocator's lock
    std::lock_guard<std::mutex> lk(g_mu);
    DeviceContext*& slot = contexts()[static_cast<size_t>(index)];
    if (!slot) slot = fresh;  // a racing thread's context wins; the loser's stream is simply unused
    ctx = slot;
  }
  DUET_CUDA_CHECK(cudaSetDevice(index), op);
  return *ctx;
}

StreamTimer::StreamTimer(DeviceContext& ctx) : ctx_(ctx) {
  DUET_CUDA_CHECK(cudaEventCreate(&start_), "StreamTimer");
  DUET_CUDA_CHECK(cudaEventCreate(&stop_), "StreamTimer");
}

StreamTimer::~StreamTimer() {
  (void)cudaEventDestroy(start_);
  (void)cudaEventDestroy(stop_);
}

void StreamTimer::start() { DUET_CUDA_CHECK(cudaEventRecord(start_, ctx_.stream()), "StreamTimer"); }
void StreamTimer::stop() { DUET_CUDA_CHECK(cudaEventRecord(stop_, ctx_.stream()), "StreamTimer"); }

double StreamTimer::elapsed_ms() {
  DUET_CUDA_CHECK(cudaEventSynchronize(stop_), "StreamTimer");
  float ms = 0;
  DUET_CUDA_CHECK(cudaEventElapsedTime(&ms, start_, stop_), "StreamTimer");
  return ms;
}

void synchronize_all(const char* op) {
  std::vector<DeviceContext*> v;
  {
    std::lock_guard<std::mutex> lk(g_mu);
    v = contexts();
  }
  for (DeviceContext* c : v)
    if (c) {
      DUET_CUDA_CHECK(cudaSetDevice(c->index()), op);
      c->synchronize(op);
    }
}

}  // namespace duet::cuda
