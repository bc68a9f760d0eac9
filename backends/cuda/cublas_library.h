// cuBLAS is loaded with dlopen at the first GPU matrix product, not linked. Linking it costs every
// process that merely starts about 210 MiB of resident memory: libcublas needs libcublasLt (over
// 500 MB), and the dynamic loader's relocations of it touch that many pages before anything runs.
// That fell on CPU-only runs of a CUDA-enabled build and on every MPI rank. cuDNN 9 already loads
// its own sub-libraries (and through them cublasLt) this way, on first use.
#pragma once
#include <cublas_v2.h>
#include <optional>
#include <string>

namespace duet::cuda {

// The cuBLAS entry points duet calls, named and typed as cublas_api.h declares them, so a call reads
// like the library's own (blas.cublasGemmStridedBatchedEx(...)) and an error message names it.
struct CublasLibrary {
  decltype(&::cublasCreate_v2) cublasCreate_v2 = nullptr;  // cublas_v2.h maps cublasCreate to it
  decltype(&::cublasSetStream_v2) cublasSetStream_v2 = nullptr;
  // cublas_api.h overloads cublasGemmStridedBatchedEx for C++ (an inline legacy variant), so the
  // exported one's type is spelled out here; cublas_library.cpp checks it against the header.
  cublasStatus_t (*cublasGemmStridedBatchedEx)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                               const void*, const void*, cudaDataType, int, long long, const void*,
                                               cudaDataType, int, long long, const void*, void*, cudaDataType, int,
                                               long long, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
  decltype(&::cublasGetProperty) cublasGetProperty = nullptr;
  decltype(&::cublasGetStatusName) cublasGetStatusName = nullptr;
  decltype(&::cublasGetStatusString) cublasGetStatusString = nullptr;
};

// cuBLAS, loaded on the first call (libcublas.so.<the major version duet was built against>, found
// the way the dynamic loader finds any library: RUNPATH, LD_LIBRARY_PATH, ld.so.cache). A library
// that is missing or lacks an entry point is a duet::Error that names it and `op`, the op that
// needed it.
const CublasLibrary& cublas_library(const char* op);

// "major.minor.patch" of the cuBLAS this process has loaded, or nullopt when nothing has needed it
// yet (asking the library would load it).
std::optional<std::string> loaded_cublas_version();

}  // namespace duet::cuda
