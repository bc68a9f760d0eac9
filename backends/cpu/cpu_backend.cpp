// The CpuBackend object, the oneDNN engine and stream it runs on, and the primitive cache: one
// map from a binary key (op, shapes, strides, dtypes, attributes) to the built primitives, so a
// training step that repeats the previous step's shapes creates no primitive at all.
#include <cstdlib>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_algorithm.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/small_gemm.h"
#include "backends/cpu/threads.h"
#include "backends/cpu/cpu_backend.h"

namespace duet {

BackendImpl& cpu_backend() {
  static CpuBackend instance;
  return instance;
}

void cpu_describe_machine(nlohmann::json& m) {
  const dnnl_version_t* v = dnnl_version();
  m["onednn"] = fmt::format("{}.{}.{}", v->major, v->minor, v->patch);
  // The kernel choices in force (environment or API), so that two reports say whether they ran
  // the same algorithms.
  m["cpu_kernels"] = {{"winograd", cpu::policy_name(cpu::winograd_policy())},
                      {"pointwise_gemm", cpu::policy_name(cpu::pointwise_gemm_policy())},
                      {"im2col_wgrad", cpu::policy_name(cpu::im2col_weight_gradient_policy())},
                      {"depthwise", cpu::policy_name(cpu::depthwise_policy())},
                      {"small_gemm", cpu::policy_name(cpu::small_gemm_policy())},
                      {"conv_autotune", cpu::conv_autotune()}};
}

namespace cpu {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

BackendImpl& reference_fallback(const std::string& why) {
  profiler::note_impl("reference loops: " + why);
  return duet::backend(Backend::reference);
}

BackendImpl* lowp_fallback(const char* op, const Tensor& t) {
  if (t.dtype() == DType::f16) return &reference_fallback("f16 has no oneDNN 2.6 CPU kernel");
  if (t.dtype() == DType::bf16) {
    // oneDNN's bf16 kernels need AVX-512 (avx512_core).
    static const bool avx512 = onednn_isa_at_least(dnnl::cpu_isa::avx512_core);
    return avx512 ? nullptr : &reference_fallback("bf16 needs AVX-512 in oneDNN, this CPU has none");
  }
  require_f32(op, t);
  return nullptr;
}

std::string shapes_str(std::initializer_list<const Tensor*> ts) {
  std::string r;
  for (const Tensor* t : ts) {
    if (!t || !t->defined()) continue;
    if (!r.empty()) r += ' ';
    r += shape_str(t->shape());
    if (!t->is_contiguous() && t->dim() == 4 && t->is_contiguous(MemoryFormat::channels_last)) r += "(nhwc)";
  }
  return r;
}

namespace {
struct Cache {
  std::mutex mu;
  std::unordered_map<std::string, std::shared_ptr<void>> map;
  int64_t hits = 0, misses = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}
}  // namespace

namespace detail {
std::shared_ptr<void> cache_find(const std::string& key) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.map.find(key);
  if (it == c.map.end()) {
    ++c.misses;
    return nullptr;
  }
  ++c.hits;
  return it->second;
}
void cache_insert(const std::string& key, std::shared_ptr<void> value) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.emplace(key, std::move(value));
}
}  // namespace detail

namespace {
struct ScratchBuf {
  void* p = nullptr;
  size_t n = 0;
  ~ScratchBuf() { std::free(p); }
};
}  // namespace

void* scratch(size_t bytes, int slot) {
  // A few slots per thread; growing only, so steady-state training allocates nothing here.
  thread_local ScratchBuf bufs[kScratchSlots];
  ScratchBuf& b = bufs[slot];
  if (b.n < bytes) {
    std::free(b.p);
    const size_t n = (bytes + 4095) / 4096 * 4096;
    b.p = std::aligned_alloc(64, n);
    DUET_CHECK(b.p, "cpu backend: could not allocate {} bytes of scratch memory", n);
    b.n = n;
  }
  return b.p;
}

}  // namespace cpu

CpuCacheStats cpu_primitive_cache_stats() {
  auto& c = cpu::cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return {c.hits, c.misses, static_cast<int64_t>(c.map.size())};
}

void cpu_primitive_cache_reset_stats() {
  auto& c = cpu::cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.hits = c.misses = 0;
}

void cpu_primitive_cache_clear() {
  auto& c = cpu::cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.clear();
  c.hits = c.misses = 0;
}

void set_num_threads(int n) {
  DUET_CHECK(n >= 1, "set_num_threads: expected n >= 1, got {}", n);
  omp_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace duet
