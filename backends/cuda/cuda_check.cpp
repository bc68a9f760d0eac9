// Turns CUDA runtime, cuDNN and cuBLAS status codes into duet::Error messages a user can act on:
// which call failed, for which op, the library's explanation, and for the errors people actually
// meet (no driver, driver too old, out of memory, a kernel fault) what to do about it.
#include "backends/cuda/cuda_check.h"
#include <cstring>
#include "backends/cuda/cublas_library.h"
#include "engine/error.h"

namespace duet::cuda {

namespace {
// The file name without its directory: enough to find the line, short enough to read.
const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

std::string cuda_hint(cudaError_t e) {
  switch (e) {
    case cudaErrorInsufficientDriver: {
      int driver = 0, runtime = 0;
      (void)cudaDriverGetVersion(&driver);
      (void)cudaRuntimeGetVersion(&runtime);
      return fmt::format(
          " (the installed NVIDIA driver supports {} but this build uses the {} runtime: install a newer driver, "
          "or rebuild duet with an older CUDA Toolkit)",
          driver ? cuda_version_str(driver) : std::string("no CUDA at all"), cuda_version_str(runtime));
    }
    case cudaErrorNoDevice: return " (no GPU is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES)";
    case cudaErrorStubLibrary: return " (libcuda.so is the toolkit's stub: the NVIDIA driver is not installed)";
    case cudaErrorMemoryAllocation: return " (the GPU is out of memory: reduce the batch size)";
    case cudaErrorNoKernelImageForDevice:
      return " (this GPU's architecture is not among those duet was compiled for, sm_75/sm_80/sm_90 by default: rebuild "
             "with -DCMAKE_CUDA_ARCHITECTURES=native)";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
      return " (a kernel faulted; the CUDA context is unusable from now on, restart the process; run with "
             "CUDA_LAUNCH_BLOCKING=1 or compute-sanitizer to find the kernel)";
    default: return "";
  }
}
}  // namespace

std::string cuda_version_str(int v) { return fmt::format("CUDA {}.{}", v / 1000, (v % 1000) / 10); }

bool stream_busy(cudaStream_t stream, const char* op, StreamQueryFn query, LastErrorFn last_error) {
  const cudaError_t e = handled(query(stream), last_error);
  if (e == cudaErrorNotReady) return true;
  if (e != cudaSuccess) throw_cuda_error(e, "cudaStreamQuery", op, __FILE__, __LINE__);
  return false;
}

void throw_cuda_error(cudaError_t e, const char* call, const char* op, const char* file, int line) {
  // Non-sticky errors stay recorded as the "last error"; clear it so the launch check of the next
  // kernel does not report this failure a second time.
  (void)cudaGetLastError();
  throw Error(fmt::format("{}: CUDA error {} ({}): {}{} [in {} at {}:{}]", op, static_cast<int>(e), cudaGetErrorName(e),
                          cudaGetErrorString(e), cuda_hint(e), call, basename_of(file), line));
}

void throw_cudnn_error(cudnnStatus_t s, const char* call, const char* op, const char* file, int line) {
  std::string hint;
  if (s == CUDNN_STATUS_NOT_SUPPORTED)
    hint = " (cuDNN has no kernel for this combination of shape, layout, dtype and attributes)";
  else if (s == CUDNN_STATUS_BAD_PARAM)
    hint = " (an argument is outside what cuDNN accepts; the shapes and strides above are what duet passed)";
  // cuDNN 9 keeps a sentence on which check failed; its status code alone rarely says which argument.
  char detail[1024] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  const std::string why = detail[0] ? fmt::format("; cuDNN says: {}", detail) : "";
  throw Error(fmt::format("{}: cuDNN error {}: {}{}{} [in {} at {}:{}]", op, static_cast<int>(s), cudnnGetErrorString(s),
                          hint, why, call, basename_of(file), line));
}

void throw_cublas_error(cublasStatus_t s, const char* call, const char* op, const char* file, int line) {
  const CublasLibrary& blas = cublas_library(op);  // loaded: a cuBLAS call returned s
  throw Error(fmt::format("{}: cuBLAS error {} ({}): {} [in {} at {}:{}]", op, static_cast<int>(s),
                          blas.cublasGetStatusName(s), blas.cublasGetStatusString(s), call, basename_of(file), line));
}

}  // namespace duet::cuda
