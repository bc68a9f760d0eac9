// Plumbing shared by the cpu kernels: the oneDNN engine and stream, the primitive cache, memory
// descriptors built from a tensor's own strides, error translation, dtype dispatch and the
// OpenMP helpers. Kept header-only so every kernel file inlines it.
#pragma once
#include <omp.h>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
#include <oneapi/dnnl/dnnl.hpp>
#include "backends/cpu/cpu_backend.h"
#include "engine/error.h"
#include "engine/frozen_copies.h"
#include "engine/profiler/events.h"
#include "engine/tensor.h"

namespace duet::cpu {

dnnl::engine& engine();
dnnl::stream& stream();

// ---- errors ------------------------------------------------------------------------------------

std::string shapes_str(std::initializer_list<const Tensor*> ts);

// Runs f; a dnnl::error becomes a duet::Error naming the op and the shapes it was given.
template <class F>
void guarded(const char* op, std::initializer_list<const Tensor*> ts, F&& f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    throw Error(fmt::format("{} on backend 'cpu': oneDNN could not run it for tensors {}: {} (status {})", op,
                            shapes_str(ts), e.what(), static_cast<int>(e.status)));
  }
}

// The reference backend for a call this backend hands over for a reason of its shape or attributes
// (a dtype it does not compute is declared in CpuBackend::support instead, and the dispatch hands it
// over), with `why` as the implementation the profiler reports.
BackendImpl& reference_fallback(const std::string& why);

// Calls f(T{}) with T = float or double.
template <class F>
void dispatch_float(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    default:
      throw Error(fmt::format("{} on backend 'cpu': dtype {} is not supported, expected f32 or f64", op, dtype_name(t)));
  }
}

// ---- the primitive cache -----------------------------------------------------------------------

// A binary key: raw bytes of every value appended. Cheaper than formatting and unambiguous as long
// as each op starts its key with a distinct tag. Built for every kernel call, so its bytes live on
// the stack (a convolution's key is about 450 bytes) and only a longer one moves to the heap.
class Key {
public:
  // The thread count is part of every key: oneDNN sizes its blocking for the team it will run on.
  explicit Key(const char* tag) {
    append(tag, std::strlen(tag) + 1);
    add(static_cast<int64_t>(omp_get_max_threads()));
  }
  Key& add(int64_t v) { append(&v, sizeof v); return *this; }
  Key& add(const Shape& v) { add(static_cast<int64_t>(v.size())); for (int64_t x : v) add(x); return *this; }
  Key& add(double v) { append(&v, sizeof v); return *this; }
  Key& add(const Tensor& t) {  // shape, strides, dtype; undefined tensors add a marker
    if (!t.defined()) return add(int64_t(-1));
    add(t.shape());
    add(t.strides());
    return add(static_cast<int64_t>(t.dtype()));
  }
  std::string_view view() const { return {spilled_.empty() ? inline_.data() : spilled_.data(), size_}; }
  std::string str() const { return std::string(view()); }

private:
  void append(const void* p, size_t n) {
    if (spilled_.empty() && size_ + n <= inline_.size()) {
      std::memcpy(inline_.data() + size_, p, n);
    } else {
      if (spilled_.empty()) spilled_.assign(inline_.data(), size_);
      spilled_.append(static_cast<const char*>(p), n);
    }
    size_ += n;
  }
  std::array<char, 768> inline_;
  std::string spilled_;  // all bytes, once they outgrow inline_
  size_t size_ = 0;
};

// A hash for maps keyed by std::string that looks up a std::string_view (a Key's bytes) without
// making a string of it (C++20 heterogeneous lookup).
struct StringViewHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using KeyedBy = std::unordered_map<std::string, V, StringViewHash, std::equal_to<>>;

namespace detail {
std::shared_ptr<void> cache_find(std::string_view key);
void cache_insert(std::string_view key, std::shared_ptr<void> value);
}  // namespace detail

// The entry of type E for key, built by make() on the first use. Entries are immutable once
// built, so concurrent users only share the lookup lock.
template <class E, class Make>
std::shared_ptr<const E> cached(const Key& key, Make&& make) {
  if (auto p = detail::cache_find(key.view())) return std::static_pointer_cast<const E>(p);
  auto e = std::make_shared<E>(make());
  detail::cache_insert(key.view(), e);
  return e;
}

// Records the implementation oneDNN picked, only when the profiler is on (building the string
// costs an allocation).
template <class PD>
void note(const PD& pd) {
  if (profiler::enabled()) profiler::note_impl(pd.impl_info_str());
}

// An activation a kernel applies to its output tile as a oneDNN post-op: relu, or relu6 as clip to
// [0, 6] (the only two a convolution or matrix product fuses: check_fused_activation).
inline void append_activation(dnnl::post_ops& ops, Activation act) {
  if (act == Activation::relu) return ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
  if (act == Activation::relu6) return ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_clip, 0.0f, 6.0f);
  throw Error("cpu backend: only relu and relu6 run as a kernel's post-op");
}

// ---- memory descriptors --------------------------------------------------------------------------

using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

inline dims to_dims(const Shape& s) { return dims(s.begin(), s.end()); }

// Whether oneDNN runs this CPU at `isa` or above (its effective ISA, which ONEDNN_MAX_CPU_ISA can
// lower). oneDNN's isa values are bit masks, each including the ones below it.
inline bool onednn_isa_at_least(dnnl::cpu_isa isa) {
  const unsigned want = static_cast<unsigned>(isa);
  return (static_cast<unsigned>(dnnl::get_effective_cpu_isa()) & want) == want;
}

// Whether oneDNN 2.6 computes bf16 on this CPU: its bf16 kernels need avx512_core at least (native
// avx512_bf16 dot products or AMX tiles where the CPU has them, emulated on plain AVX-512). Below
// that (AVX2: AMD Zen 3 and older), bf16 ops that need oneDNN go to the reference loops; duet's own
// loops (elementwise, the batch norm's rows) compute bf16 on any CPU.
inline bool onednn_computes_bf16() {
  static const bool yes = onednn_isa_at_least(dnnl::cpu_isa::avx512_core);
  return yes;
}

// oneDNN's name for an f32, bf16 or f16 element type.
inline dt dt_of(DType t) {
  switch (t) {
    case DType::f32: return dt::f32;
    case DType::bf16: return dt::bf16;
    case DType::f16: return dt::f16;
    case DType::u8: return dt::u8;  // max pooling's argmax workspace
    default: throw Error(fmt::format("backend 'cpu': dtype {} has no oneDNN data type here", dtype_name(t)));
  }
}

// The tensor's own layout, as oneDNN sees it: its shape, strides and dtype (0-d as [1]).
// The strides of size-1 dims address nothing, yet oneDNN matches formats by all strides: an
// [N, C, 1, 1] map that came out of an op as NCHW, next to an NHWC partner, sent DenseNet's
// last transition pooling to oneDNN's reference kernel (100x slower). So a 4-d tensor dense in
// channels-last order is described with exact NHWC strides (an [N, C, 1, 1] map is both), and
// one dense in NCHW order with exact NCHW strides.
inline Shape canonical_strides(const Tensor& t) {
  if (t.dim() == 4 && t.is_contiguous(MemoryFormat::channels_last)) return channels_last_strides(t.shape());
  if (t.is_contiguous()) return contiguous_strides(t.shape());
  return t.strides();
}
inline dnnl::memory::desc md_of(const Tensor& t) {
  if (t.dim() == 0) return dnnl::memory::desc({1}, dt_of(t.dtype()), dims{1});
  return dnnl::memory::desc(to_dims(t.shape()), dt_of(t.dtype()), to_dims(canonical_strides(t)));
}
// Same shape and the same element order in memory. Strides of size-1 dimensions do not matter
// ([N, C, 1, 1] is both NCHW and NHWC), so they are not compared.
inline bool same_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) > 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}
inline dnnl::memory::desc md_flat(int64_t n) { return dnnl::memory::desc({n}, dt::f32, tag::a); }
inline dnnl::memory mem(const dnnl::memory::desc& d, const Tensor& t) {
  return dnnl::memory(d, engine(), t.raw_data());
}
inline dnnl::memory mem(const dnnl::memory::desc& d, void* p) { return dnnl::memory(d, engine(), p); }

// The arguments of one primitive execution, run through oneDNN's C API. dnnl::primitive::execute
// takes a std::unordered_map and copies it to a std::vector: a few heap blocks per call, which
// batch-1 inference pays on every layer. Here they sit in fixed arrays; each memory object is held
// until the execution returns.
class ExecArgs {
public:
  ExecArgs(std::initializer_list<std::pair<int, dnnl::memory>> args) {
    for (const auto& [arg, m] : args) add(arg, m);
  }
  ExecArgs& add(int arg, const dnnl::memory& m) {
    DUET_CHECK(n_ < mems_.size(), "cpu backend: a primitive given more than {} arguments", mems_.size());
    mems_[n_] = m;
    args_[n_++] = {arg, m.get()};
    return *this;
  }
  void execute(const dnnl::primitive& p) const {
    dnnl::error::wrap_c_api(dnnl_primitive_execute(p.get(), stream().get(), static_cast<int>(n_), args_.data()),
                            "could not execute a primitive");
  }

private:
  std::array<dnnl::memory, 12> mems_;  // a batch norm backward takes 9
  std::array<dnnl_exec_arg_t, 12> args_{};
  size_t n_ = 0;
};
inline void execute(const dnnl::primitive& p, const ExecArgs& args) { args.execute(p); }

// A frozen weight (inference: Tensor::freeze) in a kernel's own layout `layout`: written by
// fill(dst) the first time under the current freeze, then kept (engine/frozen_copies.h) under
// `name`, which must say which layouts it converts between (a primitive's cache key does).
template <class Fill>
dnnl::memory kept_in_layout(const Tensor& w, std::string_view name, const dnnl::memory::desc& layout, Fill&& fill) {
  const Tensor kept = frozen_copy(w, name, [&] {
    const Tensor buf = Tensor::empty({static_cast<int64_t>(layout.get_size())}, TensorOptions(DType::u8));
    dnnl::memory dst = mem(layout, buf.raw_data());
    fill(dst);
    return buf;
  });
  return mem(layout, kept.raw_data());
}

// Scratch buffer on the host, 64-byte aligned, reused per thread: the blocked copies of weights
// and activations and other transient buffers a primitive needs between two reorders. Slots
// 0-2 belong to convolution (weights, input side, output side), 3-4 to the normalisations and
// max-pool backward, 5 to convolution again (a bias converted to the primitive's type).
constexpr int kScratchSlots = 6;
void* scratch(size_t bytes, int slot);

// ---- SIMD -----------------------------------------------------------------------------------------

// Built for the baseline x86-64 ISA (SSE2, DUET_NATIVE off), a hot loop marked with this gets an
// AVX-512 and an x86-64-v3 (AVX2 + FMA) copy as well, and the loader picks the widest the CPU
// runs (ifunc). Those clones may contract a * b + c into an FMA (more accurate, not
// bit-identical to the baseline); a file that must match the reference bit for bit is built with
// -ffp-contract=off. std::fma is an instruction there and a (correct, slow) libm call in the
// baseline clone. OpenMP regions are outlined before cloning, so mark the per-chunk function that
// a parallel_for calls, not a function containing `#pragma omp parallel`.
// Built for this machine (-march=native, DUET_MARCH_NATIVE), the baseline already has what the
// x86-64-v3 copy would add, and that copy cannot inline helpers compiled for the native CPU (GCC
// inlines only where the caller's instruction sets include the callee's, and AMD Zen 3's include
// more than x86-64-v3's): on Zen 3 the loader picked it and GELU's loop ran a call per element.
#ifdef DUET_MARCH_NATIVE
#define DUET_SIMD_CLONES __attribute__((target_clones("avx512f", "default")))
#else
#define DUET_SIMD_CLONES __attribute__((target_clones("avx512f", "arch=x86-64-v3", "default")))
#endif

// A function of duet's own AVX2 kernels (direct_conv.cpp, winograd_conv.cpp): compiled for AVX2 and
// FMA whatever the build's baseline, and called only where cpu_caps() reports both (planner.h).
#define DUET_AVX2_FMA __attribute__((target("avx2,fma")))

// ---- OpenMP ---------------------------------------------------------------------------------------

// Below this many elements a loop runs on the calling thread: waking the team costs more than
// the work (and keeps tiny ops near the dispatch floor).
constexpr int64_t kParallelGrain = 32768;

inline int max_threads() { return omp_get_max_threads(); }

// Splits [0, n) into `parts` near-equal chunks; returns chunk i's [begin, end).
inline void split_range(int64_t n, int parts, int i, int64_t& b, int64_t& e) {
  const int64_t q = n / parts, r = n % parts;
  b = i * q + std::min<int64_t>(i, r);
  e = b + q + (i < r ? 1 : 0);
}

// f(begin, end) over chunks of [0, n), in parallel when work (elements touched) is large enough.
template <class F>
void parallel_for(int64_t n, int64_t work, F&& f) {
  if (n <= 0) return;
  const int nt = max_threads();
  if (nt <= 1 || work < kParallelGrain || n == 1) {
    f(int64_t(0), n);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(std::min<int64_t>(nt, n)))
  {
    int64_t b, e;
    split_range(n, omp_get_num_threads(), omp_get_thread_num(), b, e);
    if (b < e) f(b, e);
  }
}

}  // namespace duet::cpu
