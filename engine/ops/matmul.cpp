// Front-ends of matmul and linear. Operands reach the kernel as 3-D row-major [B, rows, cols]
// blocks plus a transpose flag, so q @ k^T in attention needs no copy: the transposed view of a
// contiguous tensor is passed as the tensor itself with trans = true (what BLAS calls 'T').
// Both also run in f16/bf16, which is what autocast (engine/autocast.h) sends them.
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
struct Operand {
  Tensor t;  // contiguous 3-D
  bool trans;
};

// t's last two dims are a transposed matrix: unit stride down its rows (k^T in attention).
bool is_transposed_view(const Tensor& t) {
  return t.dim() >= 2 && t.size(-1) > 1 && t.size(-2) > 1 && t.stride(-2) == 1 && t.stride(-1) != 1;
}

// A 3-D tensor as a contiguous block, transposed or not, copying only when neither works. The
// copy keeps the unit-stride dim innermost (a transposed view is copied as its transpose and
// passed with trans = true): it then moves whole rows instead of gathering with a stride.
Operand as_operand(const Tensor& t3) {
  if (t3.is_contiguous()) return {t3, false};
  const Tensor tt = t3.transpose(1, 2);
  if (tt.is_contiguous()) return {tt, true};
  if (is_transposed_view(t3)) return {tt.contiguous(), true};
  return {t3.contiguous(), false};
}

// out[B, M, N] = a[Ba, M, K] @ b[Bb, K, N] (Ba, Bb equal or 1), dispatched as `name`.
Tensor bmm(const Tensor& a, const Tensor& b, const char* name) {
  NoGradGuard no_grad;  // callers record their own node
  const Operand oa = as_operand(a), ob = as_operand(b);
  const int64_t B = std::max(a.size(0), b.size(0)), M = a.size(1), N = b.size(2);
  Dispatch<OpId::matmul> kernel(backend_of(a), {&a, &b}, name);
  Tensor out = Tensor::empty({B, M, N}, TensorOptions(a.dtype()).with_device(a.device()));
  kernel(oa.t, ob.t, out, oa.trans, ob.trans);
  return out;
}

// t as [batch, rows, cols]: a view where the strides allow, else a copy. A transposed view (k^T
// of a k that is itself a strided view, attention's heads) is reshaped as its transpose, so that
// a copy, if needed, runs along rows and as_operand() then sees a transposed block.
Tensor as3d(const Tensor& t, int64_t batch) {
  if (t.dim() == 3) return t;
  if (t.dim() == 2) return t.unsqueeze(0);
  if (is_transposed_view(t)) return t.transpose(-1, -2).reshape({batch, t.size(-1), t.size(-2)}).transpose(1, 2);
  return t.reshape({batch, t.size(-2), t.size(-1)});
}

Tensor matmul_impl(const Tensor& a, const Tensor& b, const char* name) {
  check_float_or_half(name, "a", a);
  check_same(name, "b", b, "a", a);
  DUET_CHECK(a.dim() >= 2 && b.dim() >= 2, "{}: operands need at least 2 dims, got shapes {} and {}", name,
             shape_str(a.shape()), shape_str(b.shape()));
  DUET_CHECK(a.size(-1) == b.size(-2), "{}: inner dims differ: a is {} and b is {} (expected a[..., K] @ b[..., K, N])",
             name, shape_str(a.shape()), shape_str(b.shape()));
  const Shape ba(a.shape().begin(), a.shape().end() - 2), bb(b.shape().begin(), b.shape().end() - 2);
  const Shape batch = broadcast_shapes(name, ba, bb);
  const int64_t M = a.size(-2), N = b.size(-1);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out;
  if (b.dim() == 2 && a.dim() > 2 && a.is_contiguous()) {
    // [..., M, K] @ [K, N]: one big GEMM over all rows (how linear layers on tokens run).
    out = bmm(a.reshape({1, -1, a.size(-1)}), b.unsqueeze(0), name).view(out_shape);
  } else {
    const int64_t B = numel_of(batch);
    auto full = [&](const Tensor& t, const Shape& tb) {
      if (numel_of(tb) == 1) return as3d(t.reshape({1, t.size(-2), t.size(-1)}), 1);
      Shape s = batch;
      s.push_back(t.size(-2));
      s.push_back(t.size(-1));
      return as3d(tb == batch ? t : expand_nograd(t, s), B);
    };
    NoGradGuard no_grad;
    out = bmm(full(a, ba), full(b, bb), name).view(out_shape);
  }
  return out;
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  // Under autocast: both operands to the low dtype; the product stays low or goes back to f32.
  if (const auto low = autocast_target({&a, &b})) return autocast_output(matmul(autocast_input(a, *low), autocast_input(b, *low)));
  Tensor out = matmul_impl(a, b, "matmul");
  if (should_record({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    const Tensor ad = untracked(a), bd = untracked(b);
    const Shape sa = a.shape(), sb = b.shape();
    record("matmul", {&a, &b}, {&out}, [=](const std::vector<Tensor>& gs) {
      // A strided gradient (attention's, through the permute that puts the heads side by side)
      // feeds both products: made contiguous once here rather than copied by each.
      const bool copy_once = need_a && need_b && !gs[0].is_contiguous() && !is_transposed_view(gs[0]);
      const Tensor g = copy_once ? gs[0].contiguous() : gs[0];
      Tensor ga, gb;
      // An operand that is a transposed view gets its gradient computed transposed, (g^T a)^T for
      // b, so that its rows run the way the tensor it is a view of runs: the gradient of k in
      // q @ k^T then reaches k (and the buffer k is a slice of) without a transposing copy.
      if (need_a)
        ga = sum_to(is_transposed_view(ad) ? matmul_impl(bd, g.transpose(-1, -2), "matmul.backward_a").transpose(-1, -2)
                                           : matmul_impl(g, bd.transpose(-1, -2), "matmul.backward_a"),
                    sa);
      if (need_b)
        gb = sum_to(is_transposed_view(bd) ? matmul_impl(g.transpose(-1, -2), ad, "matmul.backward_b").transpose(-1, -2)
                                           : matmul_impl(ad.transpose(-1, -2), g, "matmul.backward_b"),
                    sb);
      return std::vector<Tensor>{ga, gb};
    });
  }
  return out;
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  // Under autocast: input, weight and bias to the low dtype; the output stays low or goes back to f32.
  if (const auto low = autocast_target({&x, &w, &bias}))
    return autocast_output(linear(autocast_input(x, *low), autocast_input(w, *low), autocast_input(bias, *low)));
  check_float_or_half("linear", "x", x);
  check_same("linear", "weight", w, "x", x);
  check_dim("linear", "weight", w, 2);
  DUET_CHECK(x.dim() >= 1 && x.size(-1) == w.size(1),
             "linear: input has shape {} but weight is {}: expected the input's last dim to be {}", shape_str(x.shape()),
             shape_str(w.shape()), w.size(1));
  if (bias.defined()) {
    check_same("linear", "bias", bias, "x", x);
    check_shape("linear", "bias", bias, {w.size(0)});
  }
  const int64_t in = w.size(1), outf = w.size(0);
  Shape out_shape = x.shape();
  out_shape.back() = outf;
  const Tensor x2 = untracked(x).reshape({-1, in}).contiguous();
  const Tensor w2 = w.is_contiguous() ? w : untracked(w).contiguous();
  Tensor y;
  {
    Dispatch<OpId::linear> kernel(backend_of(x), {&x2, &w, &bias});
    y = Tensor::empty({x2.size(0), outf}, TensorOptions(x.dtype()).with_device(x.device()));
    kernel(x2, w2, bias, y);
  }
  y = y.view(out_shape);
  if (should_record({&x, &w, &bias})) {
    const bool need_x = x.requires_grad(), need_w = w.requires_grad(), need_b = bias.defined() && bias.requires_grad();
    const Tensor wd = untracked(w2);
    const Shape xs = x.shape();
    record("linear", {&x, &w, &bias}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor g2 = gs[0].reshape({-1, outf});
      Tensor gx, gw, gb;
      if (need_x) gx = bmm(g2.unsqueeze(0), wd.unsqueeze(0), "linear.backward_data").view(xs);
      if (need_w) gw = bmm(g2.transpose(0, 1).unsqueeze(0), x2.unsqueeze(0), "linear.backward_weight").view({outf, in});
      if (need_b) gb = sum(g2, {0});
      return std::vector<Tensor>{gx, gw, gb};
    });
  }
  return y;
}

}  // namespace duet
