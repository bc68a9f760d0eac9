// Reductions on the cpu backend: OpenMP loops. The reduced and kept dims of the (contiguous)
// input are fused into alternating blocks, so every reduction becomes rows of contiguous memory
// summed either into one slot (inner dim reduced) or elementwise into an output row (inner dim
// kept, vectorised). Threads split the outputs when there are enough, else the reduced rows with
// per-thread partials. Accumulators are double, as in the reference.
#include <cmath>
#include <limits>
#include "backends/cpu/loops.h"

namespace duet {
using namespace cpu;

namespace {

template <class T>
inline double max_nan(double a, T b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return double(b);
  return a < double(b) ? double(b) : a;
}
template <class T>
inline double min_nan(double a, T b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return double(b);
  return double(b) < a ? double(b) : a;
}

// Sum of a contiguous row with eight independent accumulators, so the adds pipeline and
// vectorise without reassociation flags.
// f32: sixteen float lanes over blocks of 4096 (each lane adds at most 256 values, so its
// rounding error stays near 1e-5 relative) and a double across blocks; twice the speed of
// double lanes, which need a conversion per element.
inline double row_sum(const float* x, int64_t n) {
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 4096) {
    const int64_t e = std::min<int64_t>(n, b + 4096);
    float s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = b;
    for (; i + 16 <= e; i += 16)
      for (int j = 0; j < 16; ++j) s[j] += x[i + j];
    double r = 0.0;
    for (int j = 0; j < 16; ++j) r += s[j];
    for (; i < e; ++i) r += x[i];
    total += r;
  }
  return total;
}

template <class T>
inline double row_sum(const T* x, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += double(x[i + j]);
  double r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += double(x[i]);
  return r;
}

struct Block {
  int64_t size;
  bool reduced;
};

// Offsets (in elements) of every combination of the selected blocks, row-major over them.
std::vector<int64_t> offsets_of(const std::vector<Block>& blocks, const std::vector<int64_t>& strides, bool reduced,
                                size_t end) {
  std::vector<int64_t> offs{0};
  for (size_t i = 0; i < end; ++i) {
    if (blocks[i].reduced != reduced) continue;
    std::vector<int64_t> next;
    next.reserve(offs.size() * static_cast<size_t>(blocks[i].size));
    for (int64_t o : offs)
      for (int64_t k = 0; k < blocks[i].size; ++k) next.push_back(o + k * strides[i]);
    offs.swap(next);
  }
  return offs;
}

template <class T>
void reduce_kernel(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  const Shape& shape = x.shape();
  const int64_t nd = x.dim();
  int64_t count = 1;
  std::vector<bool> red(static_cast<size_t>(nd), false);
  for (int64_t d : dims) {
    red[d] = true;
    count *= shape[d];
  }
  DUET_CHECK(count > 0 || op == ReduceOp::sum || op == ReduceOp::mean,
             "{} on backend 'cpu': cannot reduce over an empty dimension of shape {}", reduce_name(op), shape_str(shape));
  const int64_t out_n = out.numel();
  T* po = static_cast<T*>(out.raw_data());
  // out has x's rank and size 1 on reduced dims; it is contiguous, written in row-major order.
  DUET_CHECK(out.is_contiguous(), "{} on backend 'cpu': expected a contiguous output", reduce_name(op));
  const double init = op == ReduceOp::max ? -std::numeric_limits<double>::infinity()
                    : op == ReduceOp::min ? std::numeric_limits<double>::infinity()
                                          : 0.0;
  const double scale = op == ReduceOp::mean ? 1.0 / static_cast<double>(count) : 1.0;
  if (out_n == 0) return;
  if (x.numel() == 0) {
    for (int64_t i = 0; i < out_n; ++i) po[i] = static_cast<T>(init * scale);
    return;
  }

  // Fuse dims into alternating kept/reduced blocks (size-1 dims vanish).
  std::vector<Block> blocks;
  for (int64_t d = 0; d < nd; ++d) {
    if (shape[d] == 1) continue;
    if (!blocks.empty() && blocks.back().reduced == red[d]) blocks.back().size *= shape[d];
    else blocks.push_back({shape[d], red[d]});
  }
  if (blocks.empty()) blocks.push_back({1, false});
  std::vector<int64_t> bstride(blocks.size());
  int64_t s = 1;
  for (size_t i = blocks.size(); i-- > 0;) {
    bstride[i] = s;
    s *= blocks[i].size;
  }
  const T* px = static_cast<const T*>(x.raw_data());
  const bool inner_reduced = blocks.back().reduced;
  const int64_t L = blocks.back().size;
  const size_t outer_end = blocks.size() - 1;
  const std::vector<int64_t> koff = offsets_of(blocks, bstride, false, outer_end);
  const std::vector<int64_t> roff = offsets_of(blocks, bstride, true, outer_end);
  const int64_t Ko = static_cast<int64_t>(koff.size()), Ro = static_cast<int64_t>(roff.size());
  const int64_t slot = inner_reduced ? 1 : L;  // output values per kept-outer index
  const int nt = max_threads();

  // acc[0..slot) += the row at offset `base`.
  auto accumulate = [&](double* acc, int64_t base) {
    const T* row = px + base;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::mean:
        if (inner_reduced) acc[0] += row_sum(row, L);
        else
          for (int64_t j = 0; j < L; ++j) acc[j] += double(row[j]);
        break;
      case ReduceOp::max:
        if (inner_reduced)
          for (int64_t j = 0; j < L; ++j) acc[0] = max_nan(acc[0], row[j]);
        else
          for (int64_t j = 0; j < L; ++j) acc[j] = max_nan(acc[j], row[j]);
        break;
      case ReduceOp::min:
        if (inner_reduced)
          for (int64_t j = 0; j < L; ++j) acc[0] = min_nan(acc[0], row[j]);
        else
          for (int64_t j = 0; j < L; ++j) acc[j] = min_nan(acc[j], row[j]);
        break;
    }
  };
  auto combine = [&](double a, double b) {
    switch (op) {
      case ReduceOp::max: return max_nan(a, b);
      case ReduceOp::min: return min_nan(a, b);
      default: return a + b;
    }
  };

  const int64_t work = x.numel();
  if (Ko >= nt || work < kParallelGrain || nt == 1) {
    // Enough independent outputs: each thread owns a range of kept-outer indices.
    parallel_for(Ko, work, [&](int64_t k0, int64_t k1) {
      std::vector<double> acc(static_cast<size_t>(slot));
      for (int64_t k = k0; k < k1; ++k) {
        std::fill(acc.begin(), acc.end(), init);
        for (int64_t r = 0; r < Ro; ++r) accumulate(acc.data(), koff[k] + roff[r]);
        T* o = po + k * slot;
        for (int64_t j = 0; j < slot; ++j) o[j] = static_cast<T>(acc[j] * scale);
      }
    });
    return;
  }
  // Few outputs: split the reduced rows, keep per-thread partials, combine at the end.
  std::vector<double> partial(static_cast<size_t>(nt * Ko * slot), init);
  const int64_t rows = Ko * Ro;
  const bool split_r = Ro >= nt;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    double* mine = partial.data() + static_cast<size_t>(t) * Ko * slot;
    if (split_r) {
      int64_t r0, r1;
      split_range(Ro, n, t, r0, r1);
      for (int64_t k = 0; k < Ko; ++k)
        for (int64_t r = r0; r < r1; ++r) accumulate(mine + k * slot, koff[k] + roff[r]);
    } else if (!inner_reduced) {
      // One big kept row (e.g. [R, K] with few R): split its columns instead.
      int64_t j0, j1;
      split_range(L, n, t, j0, j1);
      for (int64_t k = 0; k < Ko; ++k)
        for (int64_t r = 0; r < Ro; ++r) {
          const T* row = px + koff[k] + roff[r];
          double* acc = mine + k * slot;
          for (int64_t j = j0; j < j1; ++j) {
            if (op == ReduceOp::max) acc[j] = max_nan(acc[j], row[j]);
            else if (op == ReduceOp::min) acc[j] = min_nan(acc[j], row[j]);
            else acc[j] += double(row[j]);
          }
        }
    } else {
      // A few long reduced rows: split each row's length.
      int64_t j0, j1;
      split_range(L, n, t, j0, j1);
      for (int64_t k = 0; k < Ko; ++k)
        for (int64_t r = 0; r < Ro; ++r) {
          const T* row = px + koff[k] + roff[r] + j0;
          double& acc = mine[k];
          if (op == ReduceOp::sum || op == ReduceOp::mean) acc += row_sum(row, j1 - j0);
          else
            for (int64_t j = 0; j < j1 - j0; ++j)
              acc = op == ReduceOp::max ? max_nan(acc, row[j]) : min_nan(acc, row[j]);
        }
    }
  }
  (void)rows;
  for (int64_t i = 0; i < Ko * slot; ++i) {
    double v = partial[static_cast<size_t>(i)];
    for (int t = 1; t < nt; ++t) v = combine(v, partial[static_cast<size_t>(t * Ko * slot + i)]);
    po[i] = static_cast<T>(v * scale);
  }
}

// Index of the first maximum along dim; NaN counts as larger than everything (first NaN wins).
template <class T>
void argmax_kernel(const Tensor& x, int64_t dim, const Tensor& out) {
  const T* px = static_cast<const T*>(x.raw_data());
  int64_t* po = out.data<int64_t>();
  if (x.dim() == 0) {
    po[0] = 0;
    return;
  }
  const int64_t len = x.size(dim);
  DUET_CHECK(len > 0, "argmax on backend 'cpu': dim {} of shape {} is empty", dim, shape_str(x.shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= x.size(d);
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  parallel_for(outer * inner, x.numel(), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t o = i / inner, in = i % inner;
      const T* line = px + o * len * inner + in;
      int64_t best_i = 0;
      T best = line[0];
      for (int64_t k = 1; k < len && !std::isnan(best); ++k) {
        const T v = line[k * inner];
        if (std::isnan(v) || v > best) best = v, best_i = k;
      }
      po[i] = best_i;
    }
  });
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  DUET_CHECK(x.is_contiguous(), "{} on backend 'cpu': expected a contiguous input", reduce_name(op));
  dispatch_float(x.dtype(), reduce_name(op), [&](auto tag) { reduce_kernel<decltype(tag)>(op, x, dims, out); });
}

void CpuBackend::argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  DUET_CHECK(x.is_contiguous(), "argmax on backend 'cpu': expected a contiguous input");
  dispatch_float(x.dtype(), "argmax", [&](auto tag) { argmax_kernel<decltype(tag)>(x, dim, out); });
}

}  // namespace duet
