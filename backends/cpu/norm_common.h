// What batch_norm.cpp and layer_norm.cpp share: a [C] parameter vector (gamma, beta, a statistic)
// as a contiguous f32 pointer for oneDNN, and a result written back into a possibly strided one.
#pragma once
#include <vector>
#include "engine/tensor.h"

namespace duet::cpu {

// A [C] vector as a contiguous f32 pointer: the tensor itself when it is, else a copy into buf.
inline const float* contiguous_vec(const Tensor& t, std::vector<float>& buf) {
  const int64_t n = t.numel(), s = n > 1 ? t.stride(0) : 1;
  if (s == 1) return t.data<float>();
  buf.resize(static_cast<size_t>(n));
  const float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = p[i * s];
  return buf.data();
}

// Writes a [C] result into a possibly strided tensor.
inline void store_vec(const Tensor& t, const float* v) {
  float* p = t.data<float>();
  const int64_t n = t.numel(), s = n > 1 ? t.stride(0) : 1;
  for (int64_t i = 0; i < n; ++i) p[i * s] = v[i];
}

}  // namespace duet::cpu
