// How a convolution pass finds its cuDNN algorithm, as host code over cuDNN's status codes, so
// tests/test_cuda_host.cpp checks it without a GPU: which failures mean "try the next algorithm",
// and what happens when an algorithm cached for a problem fails later.
#pragma once
#include <cudnn.h>
#include <optional>
#include "backends/cuda/conv_key.h"

namespace duet::cuda {

// Whether a failed run means that this algorithm cannot run this problem here, so that the next
// candidate should be tried. cuDNN 9's statuses are hierarchical (a category in the thousands plus a
// detail: CUDNN_STATUS_NOT_SUPPORTED_SHAPE, _ARCH_MISMATCH, _RUNTIME_PREREQUISITE_MISSING,
// CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, ...), so the category is compared, not the code.
inline bool algorithm_cannot_run(cudnnStatus_t st) {
  const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
  return category == CUDNN_STATUS_NOT_SUPPORTED || category == CUDNN_STATUS_BAD_PARAM;
}

// Runs a pass with the algorithm cached for its problem, else searches for one. `run_cached(choice)`
// runs the cached choice and returns cuDNN's status; `search()` finds, runs and caches an algorithm
// (or throws); `fail(status)` raises the error of a status no search can mend. A cached algorithm
// that cuDNN refuses now (the same shapes with a misaligned pointer, say) is dropped and the
// problem searched again, instead of failing every later call.
template <class RunCached, class Search, class Fail>
void run_cached_or_search(ConvAlgoCache& cache, const ConvKey& key, RunCached run_cached, Search search, Fail fail) {
  if (const std::optional<ConvChoice> cached = cache.find(key)) {
    const cudnnStatus_t st = run_cached(*cached);
    if (st == CUDNN_STATUS_SUCCESS) return;
    if (!algorithm_cannot_run(st)) return fail(st);
    cache.erase(key);
  }
  search();
}

}  // namespace duet::cuda
