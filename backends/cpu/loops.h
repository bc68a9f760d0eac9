// Strided N-d walks for the OpenMP kernels. The index space is first simplified (size-1 dims
// dropped, dims put in the output's memory order, mergeable neighbours fused), so most tensors
// become one or two dims and the innermost loop is a plain unit-stride loop the compiler
// vectorises; what is left of the outer space is split across threads.
#pragma once
#include <algorithm>
#include <array>
#include <numeric>
#include "backends/cpu/common.h"

namespace duet::cpu {

// Up to kMax dims, kept in place: a walk is simplified for every copy and elementwise call, and
// vectors here were a sixth of batch-1 DenseNet's heap allocations (its concatenations; the
// journal, 2026-11-29, late morning).
template <size_t kMax>
class SmallDims {
public:
  static constexpr size_t capacity = kMax;
  SmallDims() = default;
  SmallDims(std::initializer_list<int64_t> v) {
    for (int64_t x : v) push_back(x);
  }
  void push_back(int64_t x) {
    DUET_CHECK(n_ < kMax, "cpu backend: a strided walk over more than {} dims", kMax);
    v_[n_++] = x;
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](size_t i) { return v_[i]; }
  int64_t operator[](size_t i) const { return v_[i]; }
  int64_t back() const { return v_[n_ - 1]; }

private:
  std::array<int64_t, kMax> v_{};
  size_t n_ = 0;
};

// What is left after merging: the odometer below keeps an index per dim on the stack.
using WalkDims = SmallDims<16>;

template <size_t K>
struct Walk {
  WalkDims shape;               // outer ... inner
  std::array<WalkDims, K> st;   // strides per operand, same order
  int64_t numel = 1;
};

// Simplifies shape/strides of K operands; operand 0 decides the memory order (it is the output).
template <size_t K>
Walk<K> simplify(const Shape& shape, const std::array<const Shape*, K>& strides) {
  Walk<K> w;
  const int64_t nd = static_cast<int64_t>(shape.size());
  SmallDims<64> order;  // the dims that are not 1, before merging
  for (int64_t d = 0; d < nd; ++d) {
    w.numel *= shape[d];
    if (shape[d] != 1) order.push_back(d);
  }
  if (w.numel == 0) {
    w.shape = {0};
    for (size_t k = 0; k < K; ++k) w.st[k] = {1};
    return w;
  }
  // Output memory order: outer (largest stride) first; stable keeps logical order on ties.
  // (An insertion sort: stable, and there are a few dims.)
  for (size_t i = 1; i < order.size(); ++i)
    for (size_t j = i; j > 0 && (*strides[0])[order[j - 1]] < (*strides[0])[order[j]]; --j)
      std::swap(order[j - 1], order[j]);
  for (size_t i = 0; i < order.size(); ++i) {
    const int64_t d = order[i];
    const size_t m = w.shape.size();
    bool merge = m > 0;
    for (size_t k = 0; k < K && merge; ++k)
      merge = w.st[k][m - 1] == (*strides[k])[d] * shape[d];
    if (merge) {
      w.shape[m - 1] *= shape[d];
      for (size_t k = 0; k < K; ++k) w.st[k][m - 1] = (*strides[k])[d];
    } else {
      w.shape.push_back(shape[d]);
      for (size_t k = 0; k < K; ++k) w.st[k].push_back((*strides[k])[d]);
    }
  }
  if (w.shape.empty()) {
    w.shape = {1};
    for (size_t k = 0; k < K; ++k) w.st[k] = {1};
  }
  return w;
}

// Calls row(off, len, inner_stride) for every innermost row, where off[k] is the element offset
// of the row's first element in operand k. Rows are split across threads when there is enough
// work; each thread walks its own range of rows with an odometer. Callers treat the elements of a
// row independently, so when there are fewer rows than threads (a dense tensor simplifies to one
// row) the rows are cut into pieces instead: a residual add of two dense maps ran on one thread.
template <size_t K, class F>
void for_each_row(const Walk<K>& w, F&& row) {
  const int64_t nd = static_cast<int64_t>(w.shape.size());
  const int64_t len = w.shape[nd - 1];
  if (len == 0) return;
  std::array<int64_t, K> inner;
  for (size_t k = 0; k < K; ++k) inner[k] = w.st[k][nd - 1];
  const int64_t rows = w.numel / len;
  // Row r's outer multi-index (into idx) and its first element's offset in each operand.
  const auto start_of = [&](int64_t r, int64_t* idx) {
    std::array<int64_t, K> off{};
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = r % w.shape[d];
      r /= w.shape[d];
      for (size_t k = 0; k < K; ++k) off[k] += idx[d] * w.st[k][d];
    }
    return off;
  };
  const int nt = max_threads();
  if (rows < nt && w.numel >= kParallelGrain) {
    const int64_t pieces = (nt + rows - 1) / rows;  // per row
    parallel_for(rows * pieces, w.numel, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t idx[WalkDims::capacity];
        std::array<int64_t, K> off = start_of(t / pieces, idx);
        int64_t b, e;
        split_range(len, static_cast<int>(pieces), static_cast<int>(t % pieces), b, e);
        if (b == e) continue;
        for (size_t k = 0; k < K; ++k) off[k] += b * inner[k];
        row(off, e - b, inner);
      }
    });
    return;
  }
  parallel_for(rows, w.numel, [&](int64_t r0, int64_t r1) {
    int64_t idx[WalkDims::capacity] = {0};
    std::array<int64_t, K> off = start_of(r0, idx);
    for (int64_t r = r0; r < r1; ++r) {
      row(off, len, inner);
      for (int64_t d = nd - 2; d >= 0; --d) {
        for (size_t k = 0; k < K; ++k) off[k] += w.st[k][d];
        if (++idx[d] < w.shape[d]) break;
        for (size_t k = 0; k < K; ++k) off[k] -= w.st[k][d] * w.shape[d];
        idx[d] = 0;
      }
    }
  });
}

}  // namespace duet::cpu
