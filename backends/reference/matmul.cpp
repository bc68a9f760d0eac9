// Matrix products on the host: batched matmul with optional transposes and broadcast batch, and
// the fully connected layer. Triple loops with double accumulators (float for f16/bf16 data, see
// acc_t); the matmul inner loop runs along a row of B so the compiler may vectorise it when B is
// row-major.
#include <algorithm>
#include <vector>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

// A transposed operand is just the stored tensor read with its last two strides swapped, so
// trans_a/trans_b only change which stride steps along M, K and N.
template <class T>
void matmul_kernel(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b) {
  using Acc = acc_t<T>;
  const int64_t B = out.size(0), M = out.size(1), N = out.size(2);
  const int64_t K = trans_a ? a.size(1) : a.size(2);
  // Logical A[m, k] and B[k, n] as (element pointer, stride) pairs; batch 1 broadcasts (stride 0).
  const int64_t a_sb = a.size(0) == 1 ? 0 : a.stride(0);
  const int64_t a_sm = trans_a ? a.stride(2) : a.stride(1);
  const int64_t a_sk = trans_a ? a.stride(1) : a.stride(2);
  const int64_t b_sb = b.size(0) == 1 ? 0 : b.stride(0);
  const int64_t b_sk = trans_b ? b.stride(2) : b.stride(1);
  const int64_t b_sn = trans_b ? b.stride(1) : b.stride(2);
  const T* pa = ptr<T>(a);
  const T* pb = ptr<T>(b);
  T* po = ptr<T>(out);

  std::vector<Acc> row(static_cast<size_t>(N));
  for (int64_t bi = 0; bi < B; ++bi) {
    const T* A = pa + bi * a_sb;
    const T* Bm = pb + bi * b_sb;
    for (int64_t m = 0; m < M; ++m) {
      // out[m, :] = sum_k A[m, k] * B[k, :], built a row at a time (i-k-j order).
      std::fill(row.begin(), row.end(), Acc(0));
      for (int64_t k = 0; k < K; ++k) {
        const Acc amk = widen(A[m * a_sm + k * a_sk]);
        const T* brow = Bm + k * b_sk;
        for (int64_t n = 0; n < N; ++n) row[n] += amk * Acc(widen(brow[n * b_sn]));
      }
      T* orow = po + bi * out.stride(0) + m * out.stride(1);
      for (int64_t n = 0; n < N; ++n) orow[n * out.stride(2)] = narrow<T>(row[n]);
    }
  }
}

// y[n, o] = sum_i x[n, i] w[o, i] + bias[o]: a dot product of two rows per output.
template <class T>
void linear_kernel(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  using Acc = acc_t<T>;
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  const int64_t x_sn = x.stride(0), x_si = x.stride(1);
  const int64_t w_so = w.stride(0), w_si = w.stride(1);
  const T* px = ptr<T>(x);
  const T* pw = ptr<T>(w);
  const T* pbias = bias.defined() ? ptr<T>(bias) : nullptr;
  T* py = ptr<T>(y);
  for (int64_t n = 0; n < N; ++n) {
    const T* xrow = px + n * x_sn;
    for (int64_t o = 0; o < O; ++o) {
      const T* wrow = pw + o * w_so;
      Acc acc = pbias ? Acc(widen(pbias[o * bias.stride(0)])) : Acc(0);
      for (int64_t i = 0; i < I; ++i) acc += Acc(widen(xrow[i * x_si])) * Acc(widen(wrow[i * w_si]));
      py[n * y.stride(0) + o * y.stride(1)] = narrow<T>(acc);
    }
  }
}

}  // namespace

void ReferenceBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b) {
  dispatch_float_or_half(a.dtype(), "matmul", [&](auto tag) { matmul_kernel<decltype(tag)>(a, b, out, trans_a, trans_b); });
}

void ReferenceBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  dispatch_float_or_half(x.dtype(), "linear", [&](auto tag) { linear_kernel<decltype(tag)>(x, w, bias, y); });
}

}  // namespace duet
