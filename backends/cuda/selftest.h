// `duet selftest --device cuda`: every op on random shapes, run through the public front-ends on
// the GPU and on the reference backend (plain loops, the oracle), forward and backward, compared
// element by element. The same cases drive tests/test_cuda_device.cpp.
#pragma once
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>
#include "engine/tensor.h"

namespace duet {

struct CudaSelftestCase {
  std::string name;
  std::vector<Tensor> inputs;       // host tensors; the case makes its own device copies
  std::vector<bool> differentiate;  // per input: also compare the gradient wrt it
  std::function<Tensor(const std::vector<Tensor>&)> fn;
  double atol = 1e-5, rtol = 1e-4;
};

struct CudaSelftestResult {
  std::string name;
  std::string shapes;
  double forward_error = 0;   // max |cuda - ref| / (atol + rtol |ref|) over outputs (<= 1 passes)
  double backward_error = 0;  // the same over the compared gradients
  double cuda_ms = 0;         // forward + backward on the GPU, synchronised
  bool passed = false;
  std::string error;  // an exception from either side
};

// The cases, with shapes drawn from `seed`.
std::vector<CudaSelftestCase> cuda_selftest_cases(uint64_t seed);
CudaSelftestResult run_cuda_selftest_case(const CudaSelftestCase& c, int device = 0);

// Runs every case on cuda:0 and prints a table; returns 0 when all pass, 1 when any fails, 2 when
// there is no CUDA device (the message says why).
int cuda_selftest(std::ostream& os, uint64_t seed = 2024);

}  // namespace duet
