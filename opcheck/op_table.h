// The op table: one list of cases, each an op (or a few ops) called through the public front-ends
// on inputs described by shape, layout and value range, chosen to reach the awkward paths (odd
// sizes, batch 1, 1x1/3x3/7x7 kernels, stride, dilation, groups, depthwise, channels-last,
// transposed and strided views, broadcasting, sizes past the OpenMP grain and past a GPU's grid).
//
// The table is run in three modes (opcheck/op_check.h), in the spirit of ggml's test-backend-ops:
//   conformance  a backend's outputs and gradients against the reference backend's (plain loops);
//   gradient     the gradients of the reference backend in f64 against central differences;
//   perf         forward + backward timed on a backend, with the profiler's FLOP and byte counts.
// tests/test_conformance.cpp runs the first two on the cpu backend, tests/test_cuda_device.cpp and
// `duet selftest --device cuda` the first on a GPU, `duet selftest --mode perf` and
// bench/bench_ops.cpp the third. So a case added here is checked and timed on every backend present.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include "engine/duet.h"

namespace duet::opcheck {

// How a leaf becomes the op's input: the leaf holds the gradient, the view is what the op sees.
enum class Layout { plain, channels_last, transposed, strided, expanded };

struct In {
  Shape shape;
  Layout layout = Layout::plain;
  bool grad = true;
  double lo = -1.0, hi = 1.0;
  Shape expand_to = {};  // Layout::expanded: the broadcast shape
  int64_t classes = 0;   // > 0: i64 labels in [0, classes) (no gradient)
  // A normalisation's parameter or running statistic: f32 even when the case runs in a 16-bit dtype
  // (a mixed-precision network normalises 16-bit activations with f32 parameters).
  bool param = false;
};

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Case {
  std::string name;
  std::vector<In> ins;
  // The ops under test. A case that makes tensors of its own (zeros, a generator's draws) makes them
  // on its inputs' device: a case of no input gets one ([1], no gradient) for that purpose.
  Fn f;
  double tol = 1.0;  // multiplies atol 1e-5 and rtol 1e-4 (long f32 reductions)
  // Also checked against finite differences in f64 (false where the case rounds to a narrower
  // dtype on purpose, which no finite difference survives).
  bool gradient_check = true;
  DType dtype = DType::f32;  // of the floating-point leaves in the conformance and perf modes
  // Backends that run it; empty: every one. The cpu backend leaves f64 matrix work to the reference
  // loops by design (an error names it), so the f64 cases of the matrix ops are the GPU's.
  std::vector<Backend> only = {};
  // Timed only (bench_ops' shapes): too big for the reference loops' conformance and f64 gradients.
  bool perf_only = false;
  // When > 0, the conformance tolerances instead of tol's (16-bit results: about an ulp of the type).
  double atol = 0, rtol = 0;
  // false: the 16-bit variant compares the forward only. Where an op rounds at another point than
  // the reference (a fused residual + activation: once, against the reference's after the
  // convolution), the two disagree on which outputs sit on an activation's clamp, and each flipped
  // mask moves a gradient by a whole upstream value.
  bool half_gradients = true;
};

// Every case, in families; the families are exposed for tests that force one backend path.
std::vector<Case> elementwise_cases();
std::vector<Case> reduction_cases();
std::vector<Case> linalg_cases();
std::vector<Case> conv_cases();
std::vector<Case> norm_cases();
std::vector<Case> pool_cases();
std::vector<Case> softmax_loss_cases();
std::vector<Case> memory_cases();
std::vector<Case> mixed_precision_cases();
std::vector<Case> device_cases();
std::vector<Case> optimizer_cases();
std::vector<Case> composite_cases();
std::vector<Case> perf_cases();
// The cases of the other families whose ops all run in bf16 (elementwise maths, activations,
// reductions, normalisation, pooling, softmax, concatenation, the matrix ops and the composites), in
// bf16: what a mixed-precision network's activations go through. Conformance mode only.
std::vector<Case> bf16_cases();
std::vector<Case> all_cases();

// Uniform values in [lo, hi) of the given dtype, a pure function of the seed (the reference backend
// draws them, so every backend gets the same bits).
Tensor random_values(const Shape& shape, uint64_t seed, DType dtype = DType::f64, double lo = -1.0, double hi = 1.0);

// A square pooling window: kernel k, stride s, padding pad on both axes.
Pool2dParams square_pool(int64_t k, int64_t s, int64_t pad, bool ceil_mode = false, bool count_include_pad = true);

}  // namespace duet::opcheck
