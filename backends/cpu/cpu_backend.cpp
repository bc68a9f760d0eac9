// The CpuBackend object, the oneDNN engine and stream it runs on, and the primitive cache: one
// map from a binary key (op, shapes, strides, dtypes, attributes) to the built primitives, so a
// training step that repeats the previous step's shapes creates no primitive at all.
#include <cstdlib>
#include "backends/cpu/bf16_speed.h"
#include "backends/cpu/common.h"
#include "backends/cpu/planner.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/direct_conv.h"
#include "backends/cpu/skinny_gemm.h"
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
                      {"im2col_forward", cpu::policy_name(cpu::im2col_forward_policy())},
                      {"flipped_dgrad", cpu::policy_name(cpu::flipped_data_gradient_policy())},
                      {"col2im_dgrad", cpu::policy_name(cpu::col2im_data_gradient_policy())},
                      {"own_direct", cpu::policy_name(cpu::own_direct_policy())},
                      {"own_winograd", cpu::policy_name(cpu::own_winograd_policy())},
                      {"depthwise", cpu::policy_name(cpu::depthwise_policy())},
                      {"small_gemm", cpu::policy_name(cpu::small_gemm_policy())},
                      {"skinny_gemm", cpu::policy_name(cpu::skinny_gemm_policy())},
                      {"direct_matmul", cpu::policy_name(cpu::direct_matmul_policy())},
                      {"bf16_math_in_f32", cpu::policy_name(cpu::bf16_math_in_f32_policy())},
                      {"conv_autotune", cpu::conv_autotune()}};
  // Where bf16 convolutions and matrix products run: a bf16 report from a CPU without AVX-512 (or
  // under ONEDNN_MAX_CPU_ISA=AVX2) timed the reference loops, and says so. The checks that need a
  // bf16 kernel read it here, so that "does bf16 run on oneDNN" is answered by this backend alone.
  m["cpu_bf16"] = cpu::onednn_computes_bf16() ? "onednn" : "reference_loops";
  // How bf16 products compute where oneDNN runs them (bf16_speed.h), and the measured speed of the
  // bf16 dot products that decides it: a bf16 report from one CPU kind ran other arithmetic than
  // one from another.
  if (cpu::onednn_computes_bf16()) {
    m["cpu_bf16_math"] = cpu::bf16_math_in_f32() ? "f32" : "bf16";
    m["cpu_bf16_dot_speedup"] = cpu::bf16_dot_speedup();
  }
}

// The dtypes this backend computes. bf16 runs on oneDNN's bf16 primitives, which accumulate in f32
// (where oneDNN computes bf16: common.h's onednn_computes_bf16), and on the f32 loops over widened
// chunks (on any CPU). f16 has no x86 CPU kernels in oneDNN 2.6 (they arrive with avx512_fp16 in
// later versions), so f16, and bf16 ops that need oneDNN on a CPU without AVX-512, go to the
// reference loops (f32 accumulation). Batch norm keeps bf16 below AVX-512: its row loops take
// channels-last maps, and it hands other layouts to the reference itself (batch_norm.cpp), so that
// it answers fuses_batch_norm_activation_backward for the ops it receives. f64 runs on the loops,
// not on oneDNN, which computes f32: the oneDNN ops refuse it, naming the reference backend.
DTypeSupport CpuBackend::support(OpId op, DType dt) const {
  const bool onednn_op = op == OpId::conv2d || op == OpId::conv2d_backward || op == OpId::matmul || op == OpId::linear || op == OpId::softmax ||
                         op == OpId::softmax_backward || op == OpId::batch_norm || op == OpId::batch_norm_backward ||
                         op == OpId::layer_norm || op == OpId::layer_norm_backward || op == OpId::max_pool2d ||
                         op == OpId::max_pool2d_backward || op == OpId::avg_pool2d || op == OpId::avg_pool2d_backward ||
                         op == OpId::adaptive_avg_pool2d || op == OpId::adaptive_avg_pool2d_backward;
  const bool loop_maths = op == OpId::unary || op == OpId::scalar_op || op == OpId::binary ||
                          op == OpId::activation || op == OpId::activation_backward || op == OpId::dropout;
  if (!onednn_op && !loop_maths) return {};
  if (dt == DType::f16) return {Coverage::reference_loops, "f16 has no oneDNN 2.6 CPU kernel"};
  if (dt == DType::bf16) {
    const bool own_loops = loop_maths || op == OpId::batch_norm || op == OpId::batch_norm_backward;
    if (!own_loops && !cpu::onednn_computes_bf16())
      return {Coverage::reference_loops, "bf16 needs AVX-512 in oneDNN, this CPU has none"};
    // layer norm computes bf16 inputs in f32 in its front-end (engine/ops/norm.cpp), so none arrives
    if (op == OpId::layer_norm || op == OpId::layer_norm_backward)
      return {Coverage::reference_loops, "bf16 layer norm has no cpu kernel"};
    return {};
  }
  if (loop_maths || dt == DType::f32) return {};
  if (dt == DType::f64) return {Coverage::refused, "oneDNN computes f32; use backend 'reference' for f64"};
  return {Coverage::refused, "expected f32"};
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
  KeyedBy<std::shared_ptr<void>> map;
  int64_t hits = 0, misses = 0;
};
Cache& cache() {
  static Cache c;
  return c;
}
}  // namespace

namespace detail {
std::shared_ptr<void> cache_find(std::string_view key) {
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
void cache_insert(std::string_view key, std::shared_ptr<void> value) {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.map.emplace(std::string(key), std::move(value));
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
