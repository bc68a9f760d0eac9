// The `cpu` backend: oneDNN primitives for the compute-bound ops (convolution, matmul, the
// normalisations, pooling, softmax, transcendental activations) and OpenMP loops for everything
// memory-bound (copies, elementwise maths, reductions, losses, optimizer updates). Compiled only
// when oneDNN is found (DUET_HAVE_DNNL); it never falls back to the reference backend.
#pragma once
#include <cstdint>
#include "engine/backend.h"

namespace duet {

class CpuBackend final : public BackendImpl {
public:
  Backend kind() const override { return Backend::cpu; }
  bool implements(OpId) const override { return true; }

  // One override per line of ops.def; the bodies live in the .cpp file named for the op family.
#define DUET_OP(name, params) void name params override;
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

}  // namespace duet
