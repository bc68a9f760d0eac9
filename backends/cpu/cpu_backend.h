// The `cpu` backend: oneDNN primitives for the compute-bound ops (convolution, matmul, the
// normalisations, pooling, softmax, transcendental activations) and OpenMP loops for everything
// memory-bound (copies, elementwise maths, reductions, losses, optimizer updates). Compiled only
// when oneDNN is found (DUET_HAVE_DNNL). Which dtypes it computes is declared in support()
// (cpu_backend.cpp): f16 goes to the reference loops through the dispatch, visibly.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include "engine/backend.h"

namespace duet {

class CpuBackend final : public BackendImpl {
public:
  Backend kind() const override { return Backend::cpu; }
  DTypeSupport support(OpId op, DType dt) const override;
  // oneDNN's max-pool backward scatters through its forward's workspace: the indices are that workspace.
  bool keeps_max_pool_indices() const override { return true; }
  // bf16 activations run oneDNN's bf16 primitives and the f32 loops on widened chunks; f16 has no
  // fast path on the CPU, so autocast keeps f16 activations in f32 here.
  bool keeps_low_precision_activations(DType low) const override { return low == DType::bf16; }
  // f32 on CPUs with AVX-512 (attention.cpp); bf16 and the rest compose it from oneDNN matmuls.
  bool fuses_attention(DType dt) const override;
  bool fuses_batch_norm_activation_backward(const Tensor& x) const override;
  bool reads_channel_slices_in_batch_norm(const Tensor& x) const override;

  // One override per line of ops.def; the bodies live in the .cpp file named for the op family.
#define DUET_OP(name, params, ...) void name params override;
#include "engine/ops.def"
#undef DUET_OP
};

// Primitive-cache counters since start (or the last reset). A training step that repeats the
// shapes of the previous one must add only hits.
struct CpuCacheStats {
  int64_t hits = 0, misses = 0, entries = 0;
};
CpuCacheStats cpu_primitive_cache_stats();
void cpu_primitive_cache_reset_stats();
void cpu_primitive_cache_clear();

// The backend object (backends/registry.cpp adds it to the engine's table) and its facts for every
// report's machine section: the oneDNN version and the instruction set its kernels use.
BackendImpl& cpu_backend();
void cpu_describe_machine(nlohmann::json& machine);

}  // namespace duet
