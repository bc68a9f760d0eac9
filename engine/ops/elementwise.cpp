// Front-ends of the elementwise ops: binary with broadcasting, tensor-scalar, unary math and
// activations. Their gradients are written with the same ops (as tinygrad does), except the
// activations, whose backward is one fused kernel per activation.
#include <cmath>
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
Tensor zeros_scalar_like(const Tensor& x) { return Tensor::zeros({}, TensorOptions(x.dtype()).with_device(x.device())); }

// 1 where a wins, 1/2 on ties (PyTorch splits the gradient of max/min evenly on ties).
Tensor win_mask(const Tensor& a, const Tensor& b, bool greater) {
  return add(greater ? gt(a, b) : lt(a, b), mul(eq(a, b), 0.5));
}
}  // namespace

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = binary_name(op);
  check_float_or_half(name, "a", a);
  check_float_or_half(name, "b", b);
  // A 16-bit operand meeting a wider one (a bf16 activation onto an f32 residual stream, times an
  // f32 scale): the narrower is cast up first, differentiably, as PyTorch's type promotion does.
  // f32 with f64 stays an error: silently computing in f64 is rarely what was meant.
  if (a.dtype() != b.dtype() && a.device() == b.device() && (is_half(a.dtype()) || is_half(b.dtype()))) {
    const DType t = promote_float(a.dtype(), b.dtype());
    return binary(op, a.to(t), b.to(t));
  }
  check_same(name, "b", b, "a", a);
  const Shape s = broadcast_shapes(name, a.shape(), b.shape());
  const Tensor ae = a.shape() == s ? a : expand_nograd(a, s);
  const Tensor bx = b.shape() == s ? b : expand_nograd(b, s);
  Tensor out;
  {
    Dispatch<OpId::binary> kernel(backend_of(a), {&a, &b});
    out = a.shape() == s ? empty_like_layout(a, s)
        : b.shape() == s ? empty_like_layout(b, s)
                         : Tensor::empty(s, TensorOptions(a.dtype()).with_device(a.device()));
    kernel(op, ae, bx, out);
  }
  const bool differentiable = op != BinaryOp::eq && op != BinaryOp::gt && op != BinaryOp::lt;
  if (differentiable && should_record({&a, &b})) {
    const bool need_a = a.requires_grad(), need_b = b.requires_grad();
    const Shape sa = a.shape(), sb = b.shape();
    // Keep only what this op's gradient reads: the lambda would otherwise hold every tensor it
    // names, and a residual add would pin both of its inputs and its output until backward
    // (about 900 MiB of a resnet50_cifar step at batch 64).
    const bool keep_a = (op == BinaryOp::mul && need_b) || op == BinaryOp::maximum || op == BinaryOp::minimum;
    const bool keep_b = (op == BinaryOp::mul && need_a) || op == BinaryOp::div || op == BinaryOp::maximum ||
                        op == BinaryOp::minimum;
    const bool keep_out = op == BinaryOp::div && need_b;
    const Tensor ad = keep_a ? untracked(a) : Tensor(), bd = keep_b ? untracked(b) : Tensor(),
                 od = keep_out ? out.detach() : Tensor();
    record(name, {&a, &b}, {&out}, [=](const std::vector<Tensor>& gs) {
      const Tensor& g = gs[0];
      Tensor ga, gb;
      switch (op) {
        case BinaryOp::add:
          if (need_a) ga = g;
          if (need_b) gb = g;
          break;
        case BinaryOp::sub:
          if (need_a) ga = g;
          if (need_b) gb = neg(g);
          break;
        case BinaryOp::mul:
          if (need_a) ga = mul(g, bd);
          if (need_b) gb = mul(g, ad);
          break;
        case BinaryOp::div:
          if (need_a) ga = div(g, bd);
          if (need_b) gb = neg(div(mul(g, od), bd));  // d(a/b)/db = -(a/b)/b
          break;
        case BinaryOp::maximum:
        case BinaryOp::minimum: {
          const bool greater = op == BinaryOp::maximum;
          if (need_a) ga = mul(g, win_mask(ad, bd, greater));
          if (need_b) gb = mul(g, win_mask(bd, ad, greater));
          break;
        }
        default: break;
      }
      return std::vector<Tensor>{ga.defined() ? sum_to(ga, sa) : ga, gb.defined() ? sum_to(gb, sb) : gb};
    });
  }
  return out;
}

void add_(const Tensor& acc, const Tensor& b) {
  check_float_or_half("add_", "acc", acc);
  check_writable("add_", acc);
  check_same("add_", "b", b, "acc", acc);
  DUET_CHECK(b.shape() == acc.shape(), "add_: b has shape {}, expected acc's shape {}", shape_str(b.shape()),
             shape_str(acc.shape()));
  DUET_CHECK(acc.is_dense(), "add_: acc (shape {}) must be dense: an in-place add into a view with gaps or "
             "overlaps is not supported", shape_str(acc.shape()));
  Dispatch<OpId::binary> kernel(backend_of(acc), {&acc, &b});
  kernel(BinaryOp::add, acc, b, acc);  // elementwise kernels read element i before writing it
}

Tensor add(const Tensor& a, const Tensor& b) { return binary(BinaryOp::add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return binary(BinaryOp::sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return binary(BinaryOp::mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return binary(BinaryOp::div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return binary(BinaryOp::minimum, a, b); }
Tensor eq(const Tensor& a, const Tensor& b) { return binary(BinaryOp::eq, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::gt, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return binary(BinaryOp::lt, a, b); }

Tensor scalar_op(ScalarOp op, const Tensor& x_in, double s) {
  const char* name = scalar_op_name(op);
  check_float_or_half(name, "x", x_in);
  const Tensor x = dense(x_in);
  Tensor out;
  {
    Dispatch<OpId::scalar_op> kernel(backend_of(x), {&x});
    out = empty_like_layout(x, x.shape());
    kernel(op, x, s, out);
  }
  if (should_record({&x_in})) {
    // As in binary(): keep only what the gradient reads.
    const bool keep_x = op == ScalarOp::pow || op == ScalarOp::rdiv || op == ScalarOp::maximum ||
                        op == ScalarOp::minimum;
    const Tensor xd = keep_x ? untracked(x) : Tensor(), od = op == ScalarOp::rdiv ? out.detach() : Tensor();
    record(name, {&x_in}, {&out}, [=](const std::vector<Tensor>& gs) {
      const Tensor& g = gs[0];
      Tensor gx;
      switch (op) {
        case ScalarOp::add: gx = g; break;
        case ScalarOp::mul: gx = mul(g, s); break;
        case ScalarOp::pow: gx = mul(g, mul(pow(xd, s - 1.0), s)); break;
        case ScalarOp::rsub: gx = neg(g); break;
        case ScalarOp::rdiv: gx = neg(div(mul(g, od), xd)); break;  // d(s/x)/dx = -(s/x)/x
        case ScalarOp::maximum:
        case ScalarOp::minimum: {
          const Tensor sv = Tensor::full({}, s, TensorOptions(xd.dtype()).with_device(xd.device()));
          gx = mul(g, win_mask(xd, sv, op == ScalarOp::maximum));
          break;
        }
        case ScalarOp::count: break;  // not an op: the enum's size
      }
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor add(const Tensor& x, double s) { return scalar_op(ScalarOp::add, x, s); }
Tensor mul(const Tensor& x, double s) { return scalar_op(ScalarOp::mul, x, s); }
Tensor pow(const Tensor& x, double s) { return scalar_op(ScalarOp::pow, x, s); }
Tensor rsub(const Tensor& x, double s) { return scalar_op(ScalarOp::rsub, x, s); }
Tensor rdiv(const Tensor& x, double s) { return scalar_op(ScalarOp::rdiv, x, s); }
Tensor clamp_min(const Tensor& x, double s) { return scalar_op(ScalarOp::maximum, x, s); }
Tensor clamp_max(const Tensor& x, double s) { return scalar_op(ScalarOp::minimum, x, s); }

Tensor unary(UnaryOp op, const Tensor& x_in) {
  const char* name = unary_name(op);
  check_float_or_half(name, "x", x_in);
  // exp, log, sqrt, ... of a 16-bit tensor: computed in f32 and rounded once (rare on activations).
  if (is_half(x_in.dtype()) && op != UnaryOp::neg) return unary(op, x_in.to(DType::f32)).to(x_in.dtype());
  const Tensor x = dense(x_in);
  Tensor out;
  {
    Dispatch<OpId::unary> kernel(backend_of(x), {&x});
    out = empty_like_layout(x, x.shape());
    kernel(op, x, out);
  }
  if (should_record({&x_in})) {
    // As in binary(): keep only what the gradient reads (the input or the output, never both).
    const bool from_out = op == UnaryOp::exp || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::tanh;
    const bool from_x = op == UnaryOp::log || op == UnaryOp::abs || op == UnaryOp::square;
    const Tensor xd = from_x ? untracked(x) : Tensor(), od = from_out ? out.detach() : Tensor();
    record(name, {&x_in}, {&out}, [=](const std::vector<Tensor>& gs) {
      const Tensor& g = gs[0];
      Tensor gx;
      switch (op) {
        case UnaryOp::neg: gx = neg(g); break;
        case UnaryOp::exp: gx = mul(g, od); break;
        case UnaryOp::log: gx = div(g, xd); break;
        case UnaryOp::sqrt: gx = div(mul(g, 0.5), od); break;
        case UnaryOp::rsqrt: gx = mul(mul(g, pow(od, 3.0)), -0.5); break;
        case UnaryOp::abs: {
          const Tensor z = zeros_scalar_like(xd);
          gx = mul(g, sub(gt(xd, z), lt(xd, z)));
          break;
        }
        case UnaryOp::tanh: gx = mul(g, rsub(square(od), 1.0)); break;
        case UnaryOp::square: gx = mul(g, mul(xd, 2.0)); break;
        case UnaryOp::count: break;  // not an op: the enum's size
      }
      return std::vector<Tensor>{gx};
    });
  }
  return out;
}

Tensor neg(const Tensor& x) { return unary(UnaryOp::neg, x); }
Tensor exp(const Tensor& x) { return unary(UnaryOp::exp, x); }
Tensor log(const Tensor& x) { return unary(UnaryOp::log, x); }
Tensor sqrt(const Tensor& x) { return unary(UnaryOp::sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary(UnaryOp::rsqrt, x); }
Tensor abs(const Tensor& x) { return unary(UnaryOp::abs, x); }
Tensor tanh(const Tensor& x) { return unary(UnaryOp::tanh, x); }
Tensor square(const Tensor& x) { return unary(UnaryOp::square, x); }

Tensor activation(Activation act, const Tensor& x_in, std::optional<double> alpha_in) {
  const char* name = activation_name(act);
  check_float_or_half(name, "x", x_in);
  const double alpha = alpha_in.value_or(activation_default_alpha(act));
  DUET_CHECK(std::isfinite(alpha), "{}: the parameter is {}, expected a finite number", name, alpha);
  const Tensor x = dense(x_in);
  Tensor out;
  {
    Dispatch<OpId::activation> kernel(backend_of(x), {&x});
    out = empty_like_layout(x, x.shape());
    kernel(act, alpha, x, out);
  }
  if (should_record({&x_in})) {
    // ReLU and ReLU6 keep their output, not their input, for backward: the masks agree (x > 0 iff
    // y > 0; 0 < x < 6 iff 0 < y < 6), and the output is what the next layer keeps anyway, so
    // the input (a batch norm's output in a ResNet) is freed after the forward, as PyTorch's
    // in-place ReLU achieves: one activation less per conv-bn-relu.
    const bool from_output = act == Activation::relu || act == Activation::relu6;
    const Tensor xd = from_output ? out.detach() : untracked(x);
    record(name, {&x_in}, {&out}, [=](const std::vector<Tensor>& gs) {
      return std::vector<Tensor>{activation_backward_op(act, xd, gs[0], alpha)};
    });
  }
  return out;
}

namespace detail {
Tensor activation_backward_op(Activation act, const Tensor& saved, const Tensor& g, double alpha) {
  const Tensor dy = same_layout(g, saved);
  Dispatch<OpId::activation_backward> kernel(backend_of(saved), {&saved, &dy});
  Tensor dx = empty_like_layout(saved, saved.shape());
  kernel(act, alpha, saved, dy, dx);
  return dx;
}
}  // namespace detail

Tensor relu(const Tensor& x) { return activation(Activation::relu, x); }
Tensor relu6(const Tensor& x) { return activation(Activation::relu6, x); }
Tensor gelu(const Tensor& x, bool tanh_approximation) {
  return activation(tanh_approximation ? Activation::gelu_tanh : Activation::gelu_erf, x);
}
Tensor sigmoid(const Tensor& x) { return activation(Activation::sigmoid, x); }
Tensor silu(const Tensor& x) { return activation(Activation::silu, x); }
Tensor hardswish(const Tensor& x) { return activation(Activation::hardswish, x); }
Tensor leaky_relu(const Tensor& x, double negative_slope) { return activation(Activation::leaky_relu, x, negative_slope); }

}  // namespace duet
