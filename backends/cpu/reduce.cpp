// Reductions on the cpu backend: OpenMP loops over any dense input (contiguous, channels-last
// or another permutation) without a copy. The dims are taken in x's memory order and fused into
// alternating kept/reduced blocks, so every reduction becomes rows of contiguous memory summed
// either into one slot (inner dim reduced) or elementwise into an output row (inner dim kept,
// vectorised: a channels-last [N, C, H, W] summed over N, H, W is N*H*W rows of C added into one
// row). Threads split the outputs when there are enough, else the reduced rows (or the columns)
// with per-thread partials combined in thread order, so a result depends only on the shape and
// the thread count, never on timing. Accumulators are double, as in the reference; f32 sums add
// blocks of at most 256 values per float lane first.
#include <cmath>
#include <limits>
#include <type_traits>
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

// ---- vector kernels ------------------------------------------------------------------------------

// Sum of at most 4096 floats in sixteen float lanes (each lane adds at most 256 values, so its
// rounding error stays near 1e-5 relative), lanes and tail added in double.
DUET_SIMD_CLONES double block_sum(const float* __restrict x, int64_t n) {
  float s[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
#pragma omp simd
    for (int j = 0; j < 16; ++j) s[j] += x[i + j];
  }
  double r = 0.0;
  for (int j = 0; j < 16; ++j) r += s[j];
  for (; i < n; ++i) r += x[i];
  return r;
}

inline double row_sum(const float* x, int64_t n) {
  if (n < 64) {
    double r = 0.0;
    for (int64_t i = 0; i < n; ++i) r += x[i];
    return r;
  }
  double total = 0.0;
  for (int64_t b = 0; b < n; b += 4096) total += block_sum(x + b, std::min<int64_t>(4096, n - b));
  return total;
}

// Eight independent accumulators, so the adds pipeline and vectorise without reassociation flags.
inline double row_sum(const double* x, int64_t n) {
  double s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += x[i + j];
  double r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; i < n; ++i) r += x[i];
  return r;
}

// acc[j] += sum over rows r of base[offs[r] + j], j < n. Four rows per pass over acc: with one,
// GCC vectorised across rows with gathers (12 GB/s on one thread for a [4160, 576] bias
// gradient), and each row cost a load and a store of acc besides its own load.
template <class T>
DUET_SIMD_CLONES void add_rows(T* __restrict acc, const T* __restrict base, const int64_t* offs, int64_t rows, int64_t n) {
  int64_t r = 0;
  for (; r + 4 <= rows; r += 4) {
    const T* __restrict x0 = base + offs[r];
    const T* __restrict x1 = base + offs[r + 1];
    const T* __restrict x2 = base + offs[r + 2];
    const T* __restrict x3 = base + offs[r + 3];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] += (x0[j] + x1[j]) + (x2[j] + x3[j]);
  }
  for (; r < rows; ++r) {
    const T* __restrict x = base + offs[r];
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) acc[j] += x[j];
  }
}
DUET_SIMD_CLONES void widen_add(double* __restrict acc, const float* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) acc[j] += double(x[j]);
}

// ---- reduce ----------------------------------------------------------------------------------------

struct Block {
  int64_t size;
  bool reduced;
  int64_t xs, os;  // strides (elements) of the block's innermost dim in x and, kept blocks, in out
};

// Offsets (in x, or in out with `in_out`) of every combination of the selected outer blocks,
// row-major over them.
std::vector<int64_t> offsets_of(const std::vector<Block>& blocks, bool reduced, bool in_out) {
  std::vector<int64_t> offs{0};
  for (size_t i = 0; i + 1 < blocks.size(); ++i) {
    if (blocks[i].reduced != reduced) continue;
    const int64_t st = in_out ? blocks[i].os : blocks[i].xs;
    std::vector<int64_t> next;
    next.reserve(offs.size() * static_cast<size_t>(blocks[i].size));
    for (int64_t o : offs)
      for (int64_t k = 0; k < blocks[i].size; ++k) next.push_back(o + k * st);
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
  const double init = op == ReduceOp::max ? -std::numeric_limits<double>::infinity()
                    : op == ReduceOp::min ? std::numeric_limits<double>::infinity()
                                          : 0.0;
  const double scale = op == ReduceOp::mean ? 1.0 / static_cast<double>(count) : 1.0;
  if (out_n == 0) return;
  if (x.numel() == 0) {
    // out has x's rank with size 1 on the reduced dims: any strides, walked as a flat span.
    DUET_CHECK(out.is_dense(), "{} on backend 'cpu': expected a dense output", reduce_name(op));
    for (int64_t i = 0; i < out_n; ++i) po[i] = static_cast<T>(init * scale);
    return;
  }

  // x's dims in memory order (largest stride first), fused into alternating kept/reduced blocks
  // where both x and, for kept dims, out can step over them as one (size-1 dims vanish).
  std::vector<int64_t> order;
  for (int64_t d = 0; d < nd; ++d)
    if (shape[d] != 1) order.push_back(d);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return x.stride(a) > x.stride(b); });
  std::vector<Block> blocks;
  for (int64_t d : order) {
    const bool r = red[d];
    if (!blocks.empty()) {
      Block& b = blocks.back();
      if (b.reduced == r && b.xs == x.stride(d) * shape[d] && (r || b.os == out.stride(d) * shape[d])) {
        b.size *= shape[d];
        b.xs = x.stride(d);
        b.os = r ? 0 : out.stride(d);
        continue;
      }
    }
    blocks.push_back({shape[d], r, x.stride(d), r ? 0 : out.stride(d)});
  }
  if (blocks.empty()) blocks.push_back({1, false, 1, 1});
  DUET_CHECK(blocks.back().xs == 1, "{} on backend 'cpu': expected a dense input, got strides {}", reduce_name(op),
             shape_str(x.strides()));

  const T* px = static_cast<const T*>(x.raw_data());
  const bool inner_reduced = blocks.back().reduced;
  const int64_t L = blocks.back().size, os_inner = blocks.back().os;
  const std::vector<int64_t> koff = offsets_of(blocks, false, false), kout = offsets_of(blocks, false, true);
  const std::vector<int64_t> roff = offsets_of(blocks, true, false);
  const int64_t Ko = static_cast<int64_t>(koff.size()), Ro = static_cast<int64_t>(roff.size());
  const int64_t slot = inner_reduced ? 1 : L;  // output values per kept-outer index
  const int nt = max_threads();
  const bool is_sum = op == ReduceOp::sum || op == ReduceOp::mean;

  // acc (slot values of kept-outer index k) += rows [r0, r1) restricted to columns [j0, j1);
  // acc[j] for a kept inner block, acc[0] for a reduced one.
  auto accumulate = [&](double* acc, int64_t k, int64_t r0, int64_t r1, int64_t j0, int64_t j1) {
    const T* base = px + koff[k] + j0;
    const int64_t n = j1 - j0;
    if (n <= 0) return;
    if (is_sum && inner_reduced) {
      for (int64_t r = r0; r < r1; ++r) acc[0] += row_sum(base + roff[r], n);
    } else if (is_sum) {
      if constexpr (std::is_same_v<T, float>) {
        // Float lanes over groups of 256 rows, then into the double accumulators.
        thread_local std::vector<float> lane;
        lane.resize(static_cast<size_t>(n));
        for (int64_t g = r0; g < r1; g += 256) {
          std::fill(lane.begin(), lane.end(), 0.0f);
          add_rows(lane.data(), base, roff.data() + g, std::min<int64_t>(256, r1 - g), n);
          widen_add(acc + j0, lane.data(), n);
        }
      } else {
        add_rows(acc + j0, base, roff.data() + r0, r1 - r0, n);
      }
    } else {
      const bool mx = op == ReduceOp::max;
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = base + roff[r];
        if (inner_reduced)
          for (int64_t j = 0; j < n; ++j) acc[0] = mx ? max_nan(acc[0], row[j]) : min_nan(acc[0], row[j]);
        else
          for (int64_t j = 0; j < n; ++j) acc[j0 + j] = mx ? max_nan(acc[j0 + j], row[j]) : min_nan(acc[j0 + j], row[j]);
      }
    }
  };
  auto combine = [&](double a, double b) {
    switch (op) {
      case ReduceOp::max: return max_nan(a, b);
      case ReduceOp::min: return min_nan(a, b);
      default: return a + b;
    }
  };
  auto store = [&](int64_t k, const double* acc) {
    T* o = po + kout[k];
    for (int64_t j = 0; j < slot; ++j) o[j * os_inner] = static_cast<T>(acc[j] * scale);
  };

  const int64_t work = x.numel();
  if (Ko >= nt || work < kParallelGrain || nt == 1) {
    // Enough independent outputs: each thread owns a range of kept-outer indices.
    parallel_for(Ko, work, [&](int64_t k0, int64_t k1) {
      std::vector<double> acc(static_cast<size_t>(slot));
      for (int64_t k = k0; k < k1; ++k) {
        std::fill(acc.begin(), acc.end(), init);
        accumulate(acc.data(), k, 0, Ro, 0, L);
        store(k, acc.data());
      }
    });
    return;
  }
  // Few outputs: split the reduced rows (or, with fewer rows than threads, each row's columns),
  // keep per-thread partials, combine them in thread order.
  std::vector<double> partial(static_cast<size_t>(nt * Ko * slot), init);
  const bool split_r = Ro >= nt;
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), n = omp_get_num_threads();
    double* mine = partial.data() + static_cast<size_t>(t) * Ko * slot;
    int64_t b, e;
    split_range(split_r ? Ro : L, n, t, b, e);
    for (int64_t k = 0; k < Ko; ++k) {
      if (split_r) accumulate(mine + k * slot, k, b, e, 0, L);
      else accumulate(mine + k * slot, k, 0, Ro, b, e);
    }
  }
  std::vector<double> acc(static_cast<size_t>(slot));
  for (int64_t k = 0; k < Ko; ++k) {
    for (int64_t j = 0; j < slot; ++j) {
      const size_t i = static_cast<size_t>(k * slot + j);
      double v = partial[i];
      for (int t = 1; t < nt; ++t) v = combine(v, partial[static_cast<size_t>(t * Ko * slot) + i]);
      acc[static_cast<size_t>(j)] = v;
    }
    store(k, acc.data());
  }
}

// Index of the first maximum along dim; NaN counts as larger than everything (first NaN wins).
// x is any dense layout. The outputs are walked in out's order with x's strides; a run of
// outputs that is contiguous in x is scanned together, one x row of the run per step along dim
// (NCHW over C: unit-stride rows of W), else each output scans its own line (channels-last over
// C: a contiguous line of C).
template <class T>
void argmax_kernel(const Tensor& x, int64_t dim, const Tensor& out) {
  const T* px = static_cast<const T*>(x.raw_data());
  int64_t* po = out.data<int64_t>();
  if (x.dim() == 0) {
    po[0] = 0;
    return;
  }
  const int64_t len = x.size(dim), step = x.stride(dim);
  DUET_CHECK(len > 0, "argmax on backend 'cpu': dim {} of shape {} is empty", dim, shape_str(x.shape()));
  // out has size 1 on dim, so walking out's shape visits the start of every line along dim in x.
  const Walk<2> w = simplify<2>(out.shape(), {&out.strides(), &x.strides()});
  for_each_row<2>(w, [&](const std::array<int64_t, 2>& off, int64_t n, const std::array<int64_t, 2>& is) {
    int64_t* o = po + off[0];
    const T* xs = px + off[1];
    if (is[1] == 1 && n > 1) {
      thread_local std::vector<T> best;
      best.assign(xs, xs + n);
      for (int64_t j = 0; j < n; ++j) o[j * is[0]] = 0;
      for (int64_t k = 1; k < len; ++k) {
        const T* row = xs + k * step;
        for (int64_t j = 0; j < n; ++j) {
          const T b = best[j], v = row[j];
          const bool take = b == b && (v != v || v > b);  // not after a NaN; a NaN or a larger value
          best[j] = take ? v : b;
          if (take) o[j * is[0]] = k;
        }
      }
      return;
    }
    for (int64_t j = 0; j < n; ++j) {
      const T* line = xs + j * is[1];
      int64_t best_i = 0;
      T best = line[0];
      for (int64_t k = 1; k < len && !std::isnan(best); ++k) {
        const T v = line[k * step];
        if (std::isnan(v) || v > best) best = v, best_i = k;
      }
      o[j * is[0]] = best_i;
    }
  });
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  DUET_CHECK(x.is_dense(), "{} on backend 'cpu': expected a dense input", reduce_name(op));
  dispatch_float(x.dtype(), reduce_name(op), [&](auto tag) { reduce_kernel<decltype(tag)>(op, x, dims, out); });
}

void CpuBackend::argmax(const Tensor& x, int64_t dim, const Tensor& out) {
  DUET_CHECK(x.is_dense(), "argmax on backend 'cpu': expected a dense input");
  dispatch_float(x.dtype(), "argmax", [&](auto tag) { argmax_kernel<decltype(tag)>(x, dim, out); });
}

}  // namespace duet
