// The cuda backend's planner: how each pass of a convolution gets its cuDNN algorithm, and the
// reason the profile shows ("cudnn implicit_precomp_gemm math=fma workspace=1.2 MB (benchmarked)").
// For each distinct problem (ConvKey: shapes, layout, dtype, attributes, TF32 and benchmark modes,
// device) cuDNN's heuristics are asked once (cudnnGetConvolution*Algorithm_v7), or in benchmark
// mode every algorithm is timed on the op's own tensors (cudnnFindConvolution*AlgorithmEx); the
// candidates run in order, skipping those cuDNN cannot run or whose workspace does not fit, and the
// first that runs is cached (conv_key.h). Strict FP32 (the default) keeps tensor-core kernels out
// unless no other runs. ops_conv.cpp runs the passes through run_convolution; the status logic and
// the cache's re-search are host code, tested without a GPU (tests/test_cuda_host.cpp).
#pragma once
#include <cudnn.h>
#include <optional>
#include <string>
#include <vector>
#include <fmt/format.h>
#include "backends/cuda/conv_key.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cudnn_util.h"
#include "engine/profiler/events.h"

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

// Strict FP32 was asked for (the default) and only a tensor-core (TF32) algorithm runs this problem:
// said once per process on stderr.
void warn_tf32_fallback(const char* op, const std::string& problem);
const char* algo_name(ConvPass pass, int algo);
const char* math_name(int m);

// Descriptors of one convolution problem: input x [N, C, H, W], weight [O, C / groups, KH, KW],
// output y [N, O, OH, OW], all in one memory format.
struct Problem {
  const char* op;
  DType dt;
  bool nhwc;
  TensorDesc x, y;
  FilterDesc w;
  ConvDesc conv;
  ConvKey key;
  bool strict_fp32;  // f32 without TF32: only FMA kernels may run

  Problem(const char* op_name, ConvPass pass, DType t, bool channels_last, const Shape& xs, const Shape& ws,
          const Shape& ys, const Conv2dParams& p, int device);
};

// One heuristic proposal, whichever pass it came from.
struct Candidate {
  int algo;
  int math_type;
  cudnnStatus_t status;
};

// The algorithms a cuDNN query returns, in its order: `max_count(&n)` says how many there can be,
// `query(n, &returned, perfs)` is cudnnGetConvolution*Algorithm_v7 or cudnnFindConvolution*AlgorithmEx.
template <class Perf, class MaxCount, class Query>
std::vector<Candidate> query_candidates(OpGuard& g, MaxCount max_count, Query query) {
  int count = 0, returned = 0;
  DUET_CUDNN_CHECK(max_count(&count), g.op);
  std::vector<Perf> perfs(static_cast<size_t>(std::max(count, 1)));
  DUET_CUDNN_CHECK(query(count, &returned, perfs.data()), g.op);
  std::vector<Candidate> c;
  for (int i = 0; i < returned; ++i)
    c.push_back({static_cast<int>(perfs[static_cast<size_t>(i)].algo), static_cast<int>(perfs[static_cast<size_t>(i)].mathType),
                 perfs[static_cast<size_t>(i)].status});
  return c;
}

// Benchmark mode: cuDNN times every algorithm on the problem's own tensors and returns them fastest
// first (`find(workspace, bytes)`; it writes the pass's output, which the real run then overwrites).
// The workspace it may use is the largest any proposed algorithm asks for, or as much of that as the
// allocator can give (the cache is released at most once); cuDNN reports an algorithm that needs more
// as failed, and the run below skips it.
template <class WorkspaceSize, class Find>
std::vector<Candidate> benchmarked(OpGuard& g, const std::vector<Candidate>& proposed, WorkspaceSize workspace_size,
                                   Find find) {
  size_t bytes = 0;
  for (const Candidate& c : proposed) {
    size_t b = 0;
    if (c.status == CUDNN_STATUS_SUCCESS && workspace_size(c.algo, &b) == CUDNN_STATUS_SUCCESS) bytes = std::max(bytes, b);
  }
  void* p = nullptr;
  for (bool release = true; bytes > 0; release = false, bytes /= 2)
    if ((p = g.ctx.allocator().try_allocate(bytes, MemTag::workspace, release))) break;
  const std::vector<Candidate> timed = find(p, bytes);
  if (p) g.ctx.allocator().deallocate(p, bytes, MemTag::workspace);
  return timed;
}

// The search of run_convolution: the candidates in order, the first that runs cached.
template <class Propose, class Find, class WorkspaceSize, class Run, class Note>
void search_algorithm(OpGuard& g, Problem& pb, Propose propose, Find find, WorkspaceSize workspace_size, Run run,
                      Note note) {
  std::vector<Candidate> candidates = propose();
  if (pb.key.benchmark) candidates = benchmarked(g, candidates, workspace_size, find);
  std::string tried;
  // A workspace that does not fit may release the allocator's cache (a device synchronisation) once
  // per search, not once per candidate.
  bool released = false;
  // First pass keeps the precision asked for; only if nothing runs at all may a tensor-core kernel
  // stand in for strict f32 (the profiler's impl column then says math=tensor_op).
  for (int pass = 0; pass < 2; ++pass) {
    const bool strict = pass == 0 && pb.strict_fp32;
    if (pass == 1 && !pb.strict_fp32) break;
    for (const Candidate& c : candidates) {
      if (c.status != CUDNN_STATUS_SUCCESS) continue;
      int math = c.math_type;
      if (strict) {
        // Tensor-op candidates are TF32 for f32 data; the others run with FMA math pinned on the
        // descriptor, since "default" math would itself allow TF32 on Ampere and newer.
        if (math == CUDNN_TENSOR_OP_MATH || math == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) continue;
        math = CUDNN_FMA_MATH;
      }
      DUET_CUDNN_CHECK(cudnnSetConvolutionMathType(pb.conv, static_cast<cudnnMathType_t>(math)), g.op);
      size_t bytes = 0;
      if (workspace_size(c.algo, &bytes) != CUDNN_STATUS_SUCCESS) continue;
      void* p = bytes > 0 ? g.ctx.allocator().try_allocate(bytes, MemTag::workspace, !released) : nullptr;
      if (bytes > 0 && !p) {
        released = true;
        tried += fmt::format(" {} (workspace {} does not fit);", algo_name(pb.key.pass, c.algo), format_bytes(double(bytes)));
        continue;
      }
      const cudnnStatus_t st = run(c.algo, p, bytes);
      if (p) g.ctx.allocator().deallocate(p, bytes, MemTag::workspace);
      if (st == CUDNN_STATUS_SUCCESS) {
        const ConvChoice choice{c.algo, math, bytes};
        conv_algo_cache().insert(pb.key, choice);
        note(choice);
        if (pass == 1) warn_tf32_fallback(g.op, pb.key.str());
        return;
      }
      if (!algorithm_cannot_run(st)) throw_cudnn_error(st, "cudnnConvolution*", g.op, __FILE__, __LINE__);
      tried += fmt::format(" {} ({});", algo_name(pb.key.pass, c.algo), cudnnGetErrorString(st));
    }
  }
  throw Error(fmt::format("{} on backend 'cuda': cuDNN has no algorithm that runs {}; tried:{}", g.op, pb.key.str(),
                          tried.empty() ? " none proposed" : tried));
}

// Runs `pass` with the cached algorithm, or else tries the candidates in order (cuDNN's heuristics,
// or in benchmark mode its timings) and caches the first that runs; a cached algorithm cuDNN now
// refuses is dropped and searched again (conv_search.h). `workspace_size(algo, &bytes)` and
// `run(algo, workspace, bytes)` return cuDNN statuses; `propose()` returns the heuristics'
// candidates, `find(workspace, bytes)` the timed ones.
template <class Propose, class Find, class WorkspaceSize, class Run>
void run_convolution(OpGuard& g, Problem& pb, Propose propose, Find find, WorkspaceSize workspace_size, Run run) {
  auto note = [&](const ConvChoice& c) {
    profiler::note_impl(fmt::format("cudnn {} math={} workspace={}{}", algo_name(pb.key.pass, c.algo), math_name(c.math_type),
                                    format_bytes(double(c.workspace)), pb.key.benchmark ? " (benchmarked)" : ""));
  };
  const auto run_cached = [&](const ConvChoice& c) {
    DUET_CUDNN_CHECK(cudnnSetConvolutionMathType(pb.conv, static_cast<cudnnMathType_t>(c.math_type)), g.op);
    Workspace ws(g.ctx, c.workspace);
    const cudnnStatus_t st = run(c.algo, ws.get(), ws.bytes());
    if (st == CUDNN_STATUS_SUCCESS) note(c);
    return st;
  };
  const auto fail = [&](cudnnStatus_t st) { throw_cudnn_error(st, "cudnnConvolution*", g.op, __FILE__, __LINE__); };
  const auto search = [&] { search_algorithm(g, pb, propose, find, workspace_size, run, note); };
  run_cached_or_search(conv_algo_cache(), pb.key, run_cached, search, fail);
}


}  // namespace duet::cuda
