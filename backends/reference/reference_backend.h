// The reference backend: every op of engine/ops.def as plain scalar loops over strided tensors.
// It is the readable definition of each op and the oracle the optimised backends are tested
// against, so clarity wins over speed everywhere (but index math stays out of inner loops).
#pragma once
#include "engine/backend.h"

namespace duet {

class ReferenceBackend final : public BackendImpl {
public:
  Backend kind() const override { return Backend::reference; }
  bool keeps_max_pool_indices() const override { return true; }  // the backward reads them
  // Its loops take any float dtype; the policy is the cpu backend's (bf16 yes, f16 no), whose
  // oracle it is, so the two run the same mixed-precision network.
  bool keeps_low_precision_activations(DType low) const override { return low == DType::bf16; }
  // In f32 and f64, so the cpu backend's fused f32 kernel has its oracle and the backward its f64
  // gradient check; the 16-bit dtypes compose it, as the cpu backend does.
  bool fuses_attention(DType dt) const override { return dt == DType::f32 || dt == DType::f64; }

  // One override per line of ops.def; the bodies live in the .cpp file named for the op family.
#define DUET_OP(name, params, ...) void name params override;
#include "engine/ops.def"
#undef DUET_OP
};

// The backend object; backends/registry.cpp adds it to the engine's table.
BackendImpl& reference_backend();

}  // namespace duet
