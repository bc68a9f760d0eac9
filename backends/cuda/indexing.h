// Strided indexing shared by the host (which plans a launch) and the kernels (which walk it). A
// kernel gets up to kMaxDims (size, stride...) pairs by value, after the host has dropped size-1
// dims and merged dims that are contiguous in every operand, so a permuted or broadcast tensor
// costs a few integer divisions per element and a plainly contiguous one costs none.
// No engine or CUDA header: nvcc and the host compiler both include it, and the host tests run
// the same code on the CPU.
#pragma once
#include <cstdint>
#include <vector>
#include "engine/scalar_math.h"  // DUET_HD

namespace duet::cuda {

constexpr int kMaxDims = 8;

// N operands (output first, by convention) walked over one index space.
template <int N>
struct OffsetCalc {
  int ndim = 0;
  int64_t sizes[kMaxDims] = {};
  int64_t strides[N][kMaxDims] = {};

  // Offsets (in elements) of the element with row-major linear index `linear` in each operand.
  DUET_HD void offsets(int64_t linear, int64_t (&out)[N]) const {
    if (ndim == 1) {  // the common case after merging: no division at all
      for (int k = 0; k < N; ++k) out[k] = linear * strides[k][0];
      return;
    }
    for (int k = 0; k < N; ++k) out[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = linear % sizes[d];
      linear /= sizes[d];
      for (int k = 0; k < N; ++k) out[k] += i * strides[k][d];
    }
  }
};

// Builds the calculator for `shape` with each operand's strides; false when more than kMaxDims
// dims remain after merging (the caller then reports an error or copies to contiguous first).
// Rules: size-1 dims never move the offset, so they are dropped; dims d and d+1 merge when, for
// every operand, stepping once along d is the same as stepping sizes[d+1] times along d+1.
template <int N>
bool make_offset_calc(const std::vector<int64_t>& shape, const std::vector<int64_t>* const (&strides)[N],
                      OffsetCalc<N>& calc) {
  std::vector<int64_t> sz;
  std::vector<int64_t> st[N];
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sz.push_back(shape[d]);
    for (int k = 0; k < N; ++k) st[k].push_back((*strides[k])[d]);
  }
  // Walking from the outermost dim inwards, each dim folds into the one before it when it can.
  std::vector<int64_t> msz;
  std::vector<int64_t> mst[N];
  for (size_t d = 0; d < sz.size(); ++d) {
    if (!msz.empty()) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k)
        if (mst[k].back() != st[k][d] * sz[d]) mergeable = false;
      if (mergeable) {
        msz.back() *= sz[d];
        for (int k = 0; k < N; ++k) mst[k].back() = st[k][d];
        continue;
      }
    }
    msz.push_back(sz[d]);
    for (int k = 0; k < N; ++k) mst[k].push_back(st[k][d]);
  }
  if (msz.size() > static_cast<size_t>(kMaxDims)) return false;
  calc.ndim = static_cast<int>(msz.size());
  for (int d = 0; d < calc.ndim; ++d) {
    calc.sizes[d] = msz[d];
    for (int k = 0; k < N; ++k) calc.strides[k][d] = mst[k][d];
  }
  return true;
}

// One input of a concatenation along `dim`: the offset (elements) of its slab in the output, which
// starts `start` positions along dim, and the walk over the input's shape with the output's strides
// (operand 0) beside the input's own (operand 1). Because the slab keeps the output's strides, any
// dense output layout works: a DenseNet's channels-last concatenation along channels too.
struct ConcatSlab {
  int64_t out_offset = 0;
  OffsetCalc<2> calc;
};
inline bool plan_concat_slab(const std::vector<int64_t>& out_strides, const std::vector<int64_t>& in_shape,
                             const std::vector<int64_t>& in_strides, int64_t dim, int64_t start, ConcatSlab& slab) {
  slab.out_offset = start * out_strides[static_cast<size_t>(dim)];
  const std::vector<int64_t>* const st[2] = {&out_strides, &in_strides};
  return make_offset_calc<2>(in_shape, st, slab.calc);
}

// True when the calculator is one dim of unit stride in every operand (or zero dims): kernels
// then index with the linear index directly.
template <int N>
bool is_flat(const OffsetCalc<N>& c) {
  if (c.ndim == 0) return true;
  if (c.ndim > 1) return false;
  for (int k = 0; k < N; ++k)
    if (c.strides[k][0] != 1) return false;
  return true;
}

}  // namespace duet::cuda
