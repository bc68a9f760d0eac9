// The arithmetic of duet's own CUDA kernels, as __host__ __device__ inline functions: the kernels
// call them on the GPU and tests/test_cuda_host.cpp calls the very same code on the CPU against
// the textbook formulas, so the maths is checked in every CI run even though CI has no GPU.
// Launch-configuration arithmetic lives here for the same reason.
#pragma once
#include <math.h>
#include <cstdint>
#include "backends/cuda/indexing.h"
#include "engine/scalar_math.h"
#include "engine/op_params.h"

namespace duet::cuda::math {

// ---- launch configuration ------------------------------------------------------------------------
constexpr int kBlock = 256;  // threads per block of the elementwise kernels
// Grid-stride loops cover any n, so the grid is capped: 64Ki blocks of 256 threads keep every SM of
// an H100 busy many times over while staying far below every hardware limit.
constexpr int64_t kMaxBlocks = 65536;

DUET_HD inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for n elements handled one per thread by a grid-stride loop; 0 when n <= 0 (no launch).
DUET_HD inline int64_t grid_for(int64_t n, int block = kBlock) {
  if (n <= 0) return 0;
  const int64_t g = ceil_div(n, block);
  return g < kMaxBlocks ? g : kMaxBlocks;
}

// Threads per block for kernels that reduce one row of length d per block: a power of two from 32
// (one warp) to 512, about four elements per thread, so short rows do not idle 500 threads.
DUET_HD inline int row_block(int64_t d) {
  int b = 32;
  while (b < 512 && int64_t(b) * 4 < d) b *= 2;
  return b;
}

// A reduction of `outputs` results over `extent` elements each uses one block per result when each
// result has enough work to share (or there are too few results to fill the GPU with one thread
// each), else one thread per result.
DUET_HD inline bool reduce_block_per_output(int64_t outputs, int64_t extent) {
  return extent >= 128 || outputs < 4096;
}

// How the strided reduction (kernels_reduce.cu) spreads `outputs` results over `extent` elements
// each across the GPU. Three shapes of work, chosen by which index walks memory with stride 1:
//  - columns: neighbouring outputs are neighbours in memory and the reduced elements are far apart
//    (a bias gradient, a sum over N, H, W of a channels-last tensor). A block is 32 neighbouring
//    outputs by block_y rows, so each warp reads 32 consecutive elements per step instead of each
//    thread walking its own column with a large stride;
//  - rows: the reduced elements of one output are neighbours (a row sum, a full reduction), or
//    neither index is: a block per output, its threads striding along the row, a shuffle tree;
//  - threads: many short reductions whose elements are far apart, one thread each.
// When the outputs alone make too few blocks to fill the GPU (a full reduction, GradScaler's amax,
// a bias of 64 channels), the reduced extent is cut into `splits` chunks as well, each reduced by
// blocks of its own. They write partial results, in the accumulator type, to a workspace laid out
// [outputs, splits]; a second launch then reduces that as rows. The order of every sum is fixed by
// the plan, so results are reproducible run to run (no atomics).
struct ReducePlan {
  enum class Kind { columns, rows, threads };
  Kind kind = Kind::threads;
  int block_x = kBlock, block_y = 1;  // threads per block
  int64_t blocks_x = 0;               // blocks along the outputs (grid-stride beyond that)
  int64_t splits = 1;                 // blocks along the reduced extent
  int64_t chunk = 0;                  // reduced elements per split; the last split may get fewer
};

constexpr int64_t kMaxReduceSplits = 1024;  // keeps the second pass to one short row per output
// Blocks per multiprocessor a reduction aims for before it splits the extent: enough resident
// blocks to hide memory latency.
constexpr int64_t kReduceBlocksPerSM = 4;

// `outputs_adjacent`: stepping to the next output moves one element in memory; `reduced_adjacent`:
// stepping along the reduced extent does. `multiprocessors` is the GPU's SM count; 0 forbids
// splitting (the second pass, which has no workspace of its own).
DUET_HD inline ReducePlan plan_reduce(int64_t outputs, int64_t extent, bool outputs_adjacent, bool reduced_adjacent,
                                      int multiprocessors) {
  ReducePlan p;
  int64_t min_per_split = 0;  // reduced elements a split must get for its block to be worth launching
  if (outputs_adjacent && !reduced_adjacent && extent >= 64) {
    p.kind = ReducePlan::Kind::columns;
    p.block_x = 32;
    p.block_y = 1;
    while (p.block_y < 16 && int64_t(p.block_y) * 8 <= extent) p.block_y *= 2;
    const int64_t tiles = ceil_div(outputs, 32);
    p.blocks_x = tiles < kMaxBlocks ? tiles : kMaxBlocks;
    min_per_split = int64_t(p.block_y) * 16;
  } else if (reduced_adjacent || reduce_block_per_output(outputs, extent)) {
    p.kind = ReducePlan::Kind::rows;
    p.block_x = row_block(extent);
    p.blocks_x = outputs < kMaxBlocks ? outputs : kMaxBlocks;
    min_per_split = int64_t(p.block_x) * 16;
  } else {
    p.kind = ReducePlan::Kind::threads;
    p.block_x = kBlock;
    p.blocks_x = grid_for(outputs);
  }
  p.chunk = extent;
  if (p.kind == ReducePlan::Kind::threads || multiprocessors <= 0 || p.blocks_x <= 0) return p;
  const int64_t want = kReduceBlocksPerSM * multiprocessors;
  if (p.blocks_x >= want) return p;
  int64_t splits = ceil_div(want, p.blocks_x);
  const int64_t most = extent / min_per_split;  // every split keeps at least min_per_split elements
  if (splits > most) splits = most;
  if (splits > kMaxReduceSplits) splits = kMaxReduceSplits;
  if (splits <= 1) return p;
  p.chunk = ceil_div(extent, splits);
  p.splits = ceil_div(extent, p.chunk);  // rounding the chunk up may leave fewer, never empty, splits
  return p;
}

// The reduced elements [begin, end) that split `s` of a plan covers.
DUET_HD inline void reduce_split_range(const ReducePlan& p, int64_t extent, int64_t s, int64_t& begin, int64_t& end) {
  begin = s * p.chunk;
  end = begin + p.chunk < extent ? begin + p.chunk : extent;
}

// ---- scalar helpers, activations: the one definition every backend uses (engine/scalar_math.h) ----
using duet::k_abs;
using duet::k_erf;
using duet::k_exp;
using duet::k_log;
using duet::k_nextafter;
using duet::k_pow;
using duet::k_sqrt;
using duet::k_tanh;
using duet::activation_derivative;
using duet::activation_value;
// NaN-propagating max/min: the one definition every backend uses (engine/scalar_math.h).
using duet::is_nan;
using duet::max_nan;
using duet::min_nan;

// ---- elementwise ops --------------------------------------------------------------------------------
template <class T> DUET_HD inline T apply_unary(UnaryOp op, T v) {
  switch (op) {
    case UnaryOp::neg: return -v;
    case UnaryOp::exp: return k_exp(v);
    case UnaryOp::log: return k_log(v);
    case UnaryOp::sqrt: return k_sqrt(v);
    case UnaryOp::rsqrt: return T(1) / k_sqrt(v);  // not rsqrtf: that one is 2 ulp off the reference
    case UnaryOp::abs: return k_abs(v);
    case UnaryOp::tanh: return k_tanh(v);
    case UnaryOp::square: return v * v;
    case UnaryOp::count: break;  // not an op: the enum's size
  }
  return v;
}

template <class T> DUET_HD inline T apply_scalar(ScalarOp op, T v, T s) {
  switch (op) {
    case ScalarOp::add: return v + s;
    case ScalarOp::mul: return v * s;
    case ScalarOp::pow: return k_pow(v, s);
    case ScalarOp::rsub: return s - v;
    case ScalarOp::rdiv: return s / v;
    case ScalarOp::maximum: return max_nan(v, s);
    case ScalarOp::minimum: return min_nan(v, s);
    case ScalarOp::count: break;  // not an op: the enum's size
  }
  return v;
}

template <class T> DUET_HD inline T apply_binary(BinaryOp op, T a, T b) {
  switch (op) {
    case BinaryOp::add: return a + b;
    case BinaryOp::sub: return a - b;
    case BinaryOp::mul: return a * b;
    case BinaryOp::div: return a / b;
    case BinaryOp::maximum: return max_nan(a, b);
    case BinaryOp::minimum: return min_nan(a, b);
    case BinaryOp::eq: return a == b ? T(1) : T(0);
    case BinaryOp::gt: return a > b ? T(1) : T(0);
    case BinaryOp::lt: return a < b ? T(1) : T(0);
    case BinaryOp::count: break;  // not an op: the enum's size
  }
  return a;
}

// ---- random numbers ---------------------------------------------------------------------------------
// lo + (hi - lo) * u in double, rounded to T and kept inside [lo, hi). On the GPU the multiply and
// the add are issued as separately rounded operations: nvcc would otherwise fuse them into one FMA
// and the result would differ in the last bit from the CPU backends, which do not fuse.
template <class T> DUET_HD inline T uniform_value(double lo, double hi, double u) {
#if defined(__CUDA_ARCH__)
  const double d = __dadd_rn(lo, __dmul_rn(__dadd_rn(hi, -lo), u));
#else
  const double d = lo + (hi - lo) * u;
#endif
  T v = static_cast<T>(d);
  const T lo_t = static_cast<T>(lo), hi_t = static_cast<T>(hi);
  if (lo_t < hi_t && !(v < hi_t)) v = k_nextafter(hi_t, lo_t);
  return v;
}

// (The C maths functions are called as ::f: engine headers declare duet::sqrt and others for
// Tensors, which would hide them when this header is included after those.)
// Box-Muller, cosine branch only, from two uniforms (u1 at counter 2i, u2 at 2i + 1).
DUET_HD inline double box_muller(double u1, double u2) {
  return ::sqrt(-2.0 * ::log(1.0 - u1)) * ::cos(6.283185307179586476925 * u2);
}

// ---- optimizers ---------------------------------------------------------------------------------------
// Per-step constants of Adam/AdamW, computed once on the host (in double, as PyTorch computes them
// in Python floats) and rounded to the parameter dtype.
template <class T> struct AdamConsts {
  T step_size, bc2_sqrt, eps, b1, b2, one_minus_b1, one_minus_b2, wd, decay;
  bool decoupled;
};

template <class T> inline AdamConsts<T> make_adam_consts(const AdamParams& p) {
  const double t = double(p.step);
  const double bc1 = 1.0 - ::pow(p.beta1, t), bc2 = 1.0 - ::pow(p.beta2, t);
  return {T(p.lr / bc1), T(::sqrt(bc2)), T(p.eps), T(p.beta1), T(p.beta2), T(1.0 - p.beta1), T(1.0 - p.beta2),
          T(p.weight_decay), T(1.0 - p.lr * p.weight_decay), p.decoupled};
}

// One element of Adam (AdamW when decoupled):
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,  w -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
template <class T> DUET_HD inline void adam_update(T& w, T g, T& m, T& v, const AdamConsts<T>& c) {
  if (c.decoupled) w *= c.decay;
  else g += c.wd * w;
  m = c.b1 * m + c.one_minus_b1 * g;
  v = c.b2 * v + c.one_minus_b2 * g * g;
  w -= c.step_size * m / (k_sqrt(v) / c.bc2_sqrt + c.eps);
}

template <class T> struct SgdConsts {
  T lr, wd, momentum, damp;
  bool nesterov, first_step, has_momentum;
};

// One element of SGD: g = grad + wd w; with momentum buf = first ? g : mom buf + (1 - damp) g and
// g = nesterov ? g + mom buf : buf; then w -= lr g.
template <class T> DUET_HD inline void sgd_update(T& w, T g, T* buf, const SgdConsts<T>& c) {
  g += c.wd * w;
  if (c.has_momentum) {
    *buf = c.first_step ? g : c.momentum * *buf + c.damp * g;
    g = c.nesterov ? g + c.momentum * *buf : *buf;
  }
  w -= c.lr * g;
}

// ---- pooling windows: the one definition every backend uses (engine/scalar_math.h) -------------------
using duet::PoolRange;
using duet::avg_divisor;
using duet::bin_end;
using duet::bin_start;
using duet::bins_containing;
using duet::pool_window;
using duet::windows_containing;

// ---- losses -----------------------------------------------------------------------------------------
// Cross-entropy of one row with label smoothing ls over C classes, from its log-sum-exp, the logit of
// the target and the sum of the logits:
//   loss = -(1 - ls) logp[t] - ls / C sum_c logp[c],  logp = x - lse
template <class A> DUET_HD inline A cross_entropy_row(A lse, A x_target, A sum_x, int64_t C, A ls) {
  const A sum_logp = sum_x - A(C) * lse;
  return -(A(1) - ls) * (x_target - lse) - (ls / A(C)) * sum_logp;
}

// d loss_mean / d x[c] = scale * (softmax[c] - (1 - ls) [c == t] - ls / C), scale = dloss / N.
template <class A> DUET_HD inline A cross_entropy_grad(A p, bool is_target, int64_t C, A ls, A scale) {
  return scale * (p - (is_target ? A(1) - ls : A(0)) - ls / A(C));
}

}  // namespace duet::cuda::math
