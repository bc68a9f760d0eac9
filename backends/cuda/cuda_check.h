// Status checks for the CUDA runtime, cuDNN and cuBLAS. Every call into those libraries goes
// through one of these macros, so a failure becomes a duet::Error naming the call, the duet op
// that made it and the library's own error string, instead of a crash or a silently wrong result.
// Host-only header (the .cu files return cudaError_t and the caller checks it here).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>
#include <string>

namespace duet::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t e, const char* call, const char* op, const char* file, int line);
[[noreturn]] void throw_cudnn_error(cudnnStatus_t s, const char* call, const char* op, const char* file, int line);
[[noreturn]] void throw_cublas_error(cublasStatus_t s, const char* call, const char* op, const char* file, int line);

// "CUDA 13.0" from the 13000-style integers the runtime reports.
std::string cuda_version_str(int v);

// For a status the caller deals with itself (a query that may answer "not ready", a property read
// whose failure only leaves a field empty). The runtime also records every non-success status as
// its "last error", which the launch check of the next kernel (cudaGetLastError) would then report
// as that kernel's failure: this clears it. A sticky error (a faulted context) cannot be cleared and
// is returned again by every later call. PyTorch had this bug with cudaStreamQuery (#18584).
using LastErrorFn = cudaError_t (*)();
inline cudaError_t handled(cudaError_t e, LastErrorFn last_error = cudaGetLastError) {
  if (e != cudaSuccess) (void)last_error();
  return e;
}

// Whether work is still queued on `stream` (cudaStreamQuery's cudaErrorNotReady, which is an answer,
// not a failure); any other error throws, naming `op`. The query and the last-error reset can be
// replaced, so that the host tests can play a busy stream without a GPU.
using StreamQueryFn = cudaError_t (*)(cudaStream_t);
bool stream_busy(cudaStream_t stream, const char* op, StreamQueryFn query = cudaStreamQuery,
                 LastErrorFn last_error = cudaGetLastError);

}  // namespace duet::cuda

// DUET_CUDA_CHECK(cudaMemcpyAsync(...), "copy"): `op` is the duet op (or activity) being served.
#define DUET_CUDA_CHECK(call, op)                                                         \
  do {                                                                                    \
    const cudaError_t duet_cuda_err_ = (call);                                            \
    if (duet_cuda_err_ != cudaSuccess)                                                    \
      ::duet::cuda::throw_cuda_error(duet_cuda_err_, #call, (op), __FILE__, __LINE__);    \
  } while (0)

#define DUET_CUDNN_CHECK(call, op)                                                        \
  do {                                                                                    \
    const cudnnStatus_t duet_cudnn_st_ = (call);                                          \
    if (duet_cudnn_st_ != CUDNN_STATUS_SUCCESS)                                           \
      ::duet::cuda::throw_cudnn_error(duet_cudnn_st_, #call, (op), __FILE__, __LINE__);   \
  } while (0)

#define DUET_CUBLAS_CHECK(call, op)                                                       \
  do {                                                                                    \
    const cublasStatus_t duet_cublas_st_ = (call);                                        \
    if (duet_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                         \
      ::duet::cuda::throw_cublas_error(duet_cublas_st_, #call, (op), __FILE__, __LINE__); \
  } while (0)
