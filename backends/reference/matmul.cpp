// Matrix products on the host: batched matmul with optional transposes and broadcast batch, and
// the fully connected layer. Triple loops with double accumulators; the matmul inner loop runs
// along a row of B so the compiler may vectorise it when B is row-major.
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
  const int64_t B = out.size(0), M = out.size(1), N = out.size(2);
  const int64_t K = trans_a ? a.size(1) : a.size(2);
  // Logical A[m, k] and B[k, n] as (element pointer, stride) pairs; batch 1 broadcasts (stride 0).
  const int64_t a_sb = a.size(0) == 1 ? 0 : a.stride(0);
  const int64_t a_sm = trans_a ? a.stride(2) : a.stride(1);
  const int64_t a_sk = trans_a ? a.stride(1) : a.stride(2);
  const int64_t b_sb = b.size(0) == 1 ? 0 : b.stride(0);
  const int64_t b_sk = trans_b ? b.stride(2) : b.stride(1);
  const int64_t b_sn = trans_b ? b.stride(1) : b.stride(2);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();

  std::vector<double> row(static_cast<size_t>(N));
  for (int64_t bi = 0; bi < B; ++bi) {
    const T* A = pa + bi * a_sb;
    const T* Bm = pb + bi * b_sb;
    for (int64_t m = 0; m < M; ++m) {
      // out[m, :] = sum_k A[m, k] * B[k, :], built a row at a time (i-k-j order).
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t k = 0; k < K; ++k) {
        const double amk = A[m * a_sm + k * a_sk];
        const T* brow = Bm + k * b_sk;
        for (int64_t n = 0; n < N; ++n) row[n] += amk * brow[n * b_sn];
      }
      T* orow = po + bi * out.stride(0) + m * out.stride(1);
      for (int64_t n = 0; n < N; ++n) orow[n * out.stride(2)] = static_cast<T>(row[n]);
    }
  }
}

// y[n, o] = sum_i x[n, i] w[o, i] + bias[o]: a dot product of two rows per output.
template <class T>
void linear_kernel(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  const int64_t N = x.size(0), I = x.size(1), O = w.size(0);
  const int64_t x_sn = x.stride(0), x_si = x.stride(1);
  const int64_t w_so = w.stride(0), w_si = w.stride(1);
  const T* px = x.data<T>();
  const T* pw = w.data<T>();
  const T* pbias = bias.defined() ? bias.data<T>() : nullptr;
  T* py = y.data<T>();
  for (int64_t n = 0; n < N; ++n) {
    const T* xrow = px + n * x_sn;
    for (int64_t o = 0; o < O; ++o) {
      const T* wrow = pw + o * w_so;
      double acc = pbias ? double(pbias[o * bias.stride(0)]) : 0.0;
      for (int64_t i = 0; i < I; ++i) acc += double(xrow[i * x_si]) * double(wrow[i * w_si]);
      py[n * y.stride(0) + o * y.stride(1)] = static_cast<T>(acc);
    }
  }
}

}  // namespace

void ReferenceBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out, bool trans_a, bool trans_b) {
  dispatch_float(a.dtype(), "matmul", [&](auto tag) { matmul_kernel<decltype(tag)>(a, b, out, trans_a, trans_b); });
}

void ReferenceBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y) {
  dispatch_float(x.dtype(), "linear", [&](auto tag) { linear_kernel<decltype(tag)>(x, w, bias, y); });
}

}  // namespace duet
