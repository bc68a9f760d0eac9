#include "engine/op_cost.h"

namespace duet::cost {

double bytes_of(const Tensor& t) { return t.defined() ? static_cast<double>(t.nbytes()) : 0.0; }

double distinct_bytes_of(const Tensor& t) {
  if (!t.defined() || t.numel() == 0) return 0.0;
  double n = 1;
  for (int64_t d = 0; d < t.dim(); ++d)
    if (t.stride(d) != 0) n *= static_cast<double>(t.size(d));
  return n * static_cast<double>(dtype_size(t.dtype()));
}

OpCost elementwise(std::initializer_list<const Tensor*> inputs, std::initializer_list<const Tensor*> outputs,
                   double flops_per_element) {
  OpCost c;
  double n = 0;
  for (const Tensor* t : inputs) c.bytes += t ? distinct_bytes_of(*t) : 0;
  for (const Tensor* t : outputs) {
    if (!t || !t->defined()) continue;
    c.bytes += bytes_of(*t);
    n = std::max(n, static_cast<double>(t->numel()));
  }
  c.flops = flops_per_element * n;
  return c;
}

OpCost matmul(int64_t batch, int64_t m, int64_t n, int64_t k, size_t elem, bool bias) {
  OpCost c;
  c.flops = 2.0 * batch * m * n * k + (bias ? 1.0 * batch * m * n : 0.0);
  c.bytes = static_cast<double>(elem) * (batch * (m * k + k * n + m * n) + (bias ? n : 0));
  return c;
}

OpCost conv2d(const Shape& x, const Shape& w, const Shape& y, size_t elem, bool bias, bool residual) {
  OpCost c;
  const double out = static_cast<double>(numel_of(y));
  const double per_out = 2.0 * w[1] * w[2] * w[3];
  c.flops = out * per_out + (bias ? out : 0.0) + (residual ? out : 0.0);
  c.bytes = static_cast<double>(elem) *
            (numel_of(x) + numel_of(w) + (residual ? 2.0 : 1.0) * numel_of(y) + (bias ? w[0] : 0));
  return c;
}

OpCost batch_norm(const Shape& x, size_t elem, bool training, bool residual) {
  const double n = static_cast<double>(numel_of(x));
  return {(training ? 8.0 * n : 2.0 * n) + (residual ? n : 0.0), (residual ? 3.0 : 2.0) * n * static_cast<double>(elem)};
}
OpCost batch_norm_backward(const Shape& x, size_t elem) {
  const double n = static_cast<double>(numel_of(x));
  return {9.0 * n, 3.0 * n * static_cast<double>(elem)};
}
OpCost layer_norm(const Shape& x, size_t elem) {
  const double n = static_cast<double>(numel_of(x));
  return {8.0 * n, 2.0 * n * static_cast<double>(elem)};
}
OpCost layer_norm_backward(const Shape& x, size_t elem) {
  const double n = static_cast<double>(numel_of(x));
  return {12.0 * n, 3.0 * n * static_cast<double>(elem)};
}
OpCost pool2d(const Shape& x, const Shape& y, int64_t kh, int64_t kw, size_t elem) {
  return {static_cast<double>(numel_of(y)) * kh * kw,
          static_cast<double>(elem) * (numel_of(x) + numel_of(y))};
}
OpCost adaptive_pool2d(const Shape& x, const Shape& y, size_t elem) {
  const int64_t kh = (x[2] + y[2] - 1) / y[2], kw = (x[3] + y[3] - 1) / y[3];
  return pool2d(x, y, kh, kw, elem);
}
OpCost softmax(const Shape& x, size_t elem) {
  const double n = static_cast<double>(numel_of(x));
  return {5.0 * n, 2.0 * n * static_cast<double>(elem)};
}
OpCost attention(const Shape& qkv, int64_t heads, size_t elem, bool backward) {
  const double N = static_cast<double>(qkv[0]), S = static_cast<double>(qkv[1]), D = static_cast<double>(qkv[2]) / 3.0;
  const double probs = N * static_cast<double>(heads) * S * S;
  const double gemm = 2.0 * N * S * S * D;  // one product over every head
  const double e = static_cast<double>(elem);
  if (backward) return {4.0 * gemm + 4.0 * probs, e * (2.0 * N * S * 3.0 * D + N * S * D + probs)};
  return {2.0 * gemm + 5.0 * probs, e * (N * S * 3.0 * D + N * S * D + probs)};
}
OpCost cross_entropy(const Shape& logits, size_t elem) {
  const double n = static_cast<double>(numel_of(logits));
  return {5.0 * n, n * static_cast<double>(elem) + 8.0 * logits[0]};
}
OpCost reduce(const Shape& x, const Shape& out, size_t elem) {
  return {static_cast<double>(numel_of(x)), static_cast<double>(elem) * (numel_of(x) + numel_of(out))};
}

}  // namespace duet::cost
