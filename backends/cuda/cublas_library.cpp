#include "backends/cuda/cublas_library.h"
#include <dlfcn.h>
#include <atomic>
#include <mutex>
#include <type_traits>
#include <fmt/format.h>
#include "engine/error.h"

namespace duet::cuda {

// The exported cublasGemmStridedBatchedEx has the type written in the header above (the cast picks
// that overload; decltype does not evaluate it, so nothing links against cuBLAS).
using GemmFn = decltype(CublasLibrary::cublasGemmStridedBatchedEx);
static_assert(std::is_same_v<decltype(static_cast<GemmFn>(&::cublasGemmStridedBatchedEx)), GemmFn>);

namespace {

std::once_flag g_once;
std::atomic<bool> g_loaded{false};
CublasLibrary g_lib;
std::string g_error;  // why loading failed, kept for every later call

template <class F>
void resolve(void* lib, const char* name, F& fn, std::string& missing) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  if (!fn) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
}

void load() {
  const std::string name = fmt::format("libcublas.so.{}", CUBLAS_VER_MAJOR);
  void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* why = dlerror();
    g_error = fmt::format("cannot load cuBLAS ({}): {}; the CUDA Toolkit's or the nvidia-cublas package's lib folder "
                          "must be on the loader's path (LD_LIBRARY_PATH)",
                          name, why ? why : "not found");
    return;
  }
  CublasLibrary l;
  std::string missing;
  resolve(lib, "cublasCreate_v2", l.cublasCreate_v2, missing);
  resolve(lib, "cublasSetStream_v2", l.cublasSetStream_v2, missing);
  resolve(lib, "cublasGemmStridedBatchedEx", l.cublasGemmStridedBatchedEx, missing);
  resolve(lib, "cublasGetProperty", l.cublasGetProperty, missing);
  resolve(lib, "cublasGetStatusName", l.cublasGetStatusName, missing);
  resolve(lib, "cublasGetStatusString", l.cublasGetStatusString, missing);
  if (!missing.empty()) {
    g_error = fmt::format("{} lacks {}: it is not the cuBLAS {} duet was built against", name, missing, CUBLAS_VER_MAJOR);
    dlclose(lib);
    return;
  }
  g_lib = l;  // the library stays loaded for the life of the process
  g_loaded.store(true, std::memory_order_release);
}

}  // namespace

const CublasLibrary& cublas_library(const char* op) {
  std::call_once(g_once, load);
  if (!g_loaded.load(std::memory_order_acquire)) throw Error(fmt::format("{}: {}", op, g_error));
  return g_lib;
}

std::optional<std::string> loaded_cublas_version() {
  if (!g_loaded.load(std::memory_order_acquire)) return std::nullopt;
  int major = 0, minor = 0, patch = 0;
  if (g_lib.cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      g_lib.cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      g_lib.cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
    return std::nullopt;
  return fmt::format("{}.{}.{}", major, minor, patch);
}

}  // namespace duet::cuda
