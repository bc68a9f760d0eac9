// Multi-head self-attention from a packed q/k/v projection, forward and backward, as scalar loops
// in double over one image and head at a time. For head h of image n, with D = H * Dh:
//   q[i, d] = qkv[n, i, h Dh + d],  k[j, d] = qkv[n, j, D + h Dh + d],  v[j, d] = qkv[n, j, 2D + h Dh + d]
//   P[i, :] = softmax(scale q[i, :] . k[j, :] over j),  out[n, i, h Dh + d] = sum_j P[i, j] v[j, d]
// Backward, given dO[i, d] = dout[n, i, h Dh + d]:
//   dv[j, d] = sum_i P[i, j] dO[i, d],  dP[i, j] = dO[i, :] . v[j, :]
//   dZ[i, j] = P[i, j] (dP[i, j] - sum_j' P[i, j'] dP[i, j'])   (the softmax's backward)
//   dq[i, d] = scale sum_j dZ[i, j] k[j, d],  dk[j, d] = scale sum_i dZ[i, j] q[i, d]
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"

namespace duet {
using namespace ref;

namespace {

// Where head h of image n finds its q, k, v (row stride 3D) and its slice of out (row stride D).
struct Head {
  int64_t S, D, Dh;
  int64_t q, k, v, o, p;  // offsets of q[0, 0], k[0, 0], v[0, 0], out[0, 0] and P[0, 0]
  Head(const Tensor& qkv, int64_t heads, int64_t n, int64_t h)
      : S(qkv.size(1)), D(qkv.size(2) / 3), Dh(D / heads) {
    q = n * S * 3 * D + h * Dh;
    k = q + D;
    v = q + 2 * D;
    o = n * S * D + h * Dh;
    p = (n * heads + h) * S * S;
  }
};

template <class T>
void attention_kernel(const Tensor& qkv, int64_t heads, double scale, const Tensor& out, const Tensor& probs) {
  const T* x = ptr<T>(qkv);
  T* po = ptr<T>(out);
  T* pp = ptr<T>(probs);
  for (int64_t n = 0; n < qkv.size(0); ++n)
    for (int64_t h = 0; h < heads; ++h) {
      const Head a(qkv, heads, n, h);
      const int64_t ld = 3 * a.D;
      std::vector<double> z(static_cast<size_t>(a.S));
      for (int64_t i = 0; i < a.S; ++i) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j < a.S; ++j) {
          double s = 0.0;
          for (int64_t d = 0; d < a.Dh; ++d) s += double(widen(x[a.q + i * ld + d])) * double(widen(x[a.k + j * ld + d]));
          z[size_t(j)] = scale * s;
          mx = std::max(mx, z[size_t(j)]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j < a.S; ++j) sum += std::exp(z[size_t(j)] - mx);
        for (int64_t j = 0; j < a.S; ++j) pp[a.p + i * a.S + j] = narrow<T>(std::exp(z[size_t(j)] - mx) / sum);
        for (int64_t d = 0; d < a.Dh; ++d) {
          double o = 0.0;
          for (int64_t j = 0; j < a.S; ++j) o += double(widen(pp[a.p + i * a.S + j])) * double(widen(x[a.v + j * ld + d]));
          po[a.o + i * a.D + d] = narrow<T>(o);
        }
      }
    }
}

template <class T>
void attention_backward_kernel(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads, double scale,
                               const Tensor& dqkv) {
  const T* x = ptr<T>(qkv);
  const T* pp = ptr<T>(probs);
  const T* pdo = ptr<T>(dout);
  T* dx = ptr<T>(dqkv);
  for (int64_t n = 0; n < qkv.size(0); ++n)
    for (int64_t h = 0; h < heads; ++h) {
      const Head a(qkv, heads, n, h);
      const int64_t ld = 3 * a.D, S = a.S;
      auto P = [&](int64_t i, int64_t j) { return double(widen(pp[a.p + i * S + j])); };
      auto dO = [&](int64_t i, int64_t d) { return double(widen(pdo[a.o + i * a.D + d])); };
      auto at = [&](int64_t base, int64_t r, int64_t d) { return double(widen(x[base + r * ld + d])); };
      std::vector<double> dz(static_cast<size_t>(S * S));
      for (int64_t i = 0; i < S; ++i) {
        double dot = 0.0;  // sum_j P[i, j] dP[i, j]
        for (int64_t j = 0; j < S; ++j) {
          double dp = 0.0;
          for (int64_t d = 0; d < a.Dh; ++d) dp += dO(i, d) * at(a.v, j, d);
          dz[size_t(i * S + j)] = dp;
          dot += P(i, j) * dp;
        }
        for (int64_t j = 0; j < S; ++j) dz[size_t(i * S + j)] = P(i, j) * (dz[size_t(i * S + j)] - dot);
      }
      for (int64_t r = 0; r < S; ++r)
        for (int64_t d = 0; d < a.Dh; ++d) {
          double dq = 0.0, dk = 0.0, dv = 0.0;
          for (int64_t t = 0; t < S; ++t) {
            dq += dz[size_t(r * S + t)] * at(a.k, t, d);
            dk += dz[size_t(t * S + r)] * at(a.q, t, d);
            dv += P(t, r) * dO(t, d);
          }
          dx[a.q + r * ld + d] = narrow<T>(scale * dq);
          dx[a.k + r * ld + d] = narrow<T>(scale * dk);
          dx[a.v + r * ld + d] = narrow<T>(dv);
        }
    }
}

}  // namespace

void ReferenceBackend::attention(const Tensor& qkv, int64_t heads, double scale, const Tensor& out, const Tensor& probs) {
  dispatch_float_or_half(qkv.dtype(), "attention", [&](auto tag) {
    attention_kernel<decltype(tag)>(qkv, heads, scale, out, probs);
  });
}

void ReferenceBackend::attention_backward(const Tensor& qkv, const Tensor& probs, const Tensor& dout, int64_t heads,
                                          double scale, const Tensor& dqkv) {
  dispatch_float_or_half(qkv.dtype(), "attention.backward", [&](auto tag) {
    attention_backward_kernel<decltype(tag)>(qkv, probs, dout, heads, scale, dqkv);
  });
}

}  // namespace duet
