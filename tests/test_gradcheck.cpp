// Every differentiable op's backward against central finite differences, in f64 on the
// reference backend, on several shapes (odd sizes, batch 1, strides, groups, broadcasting).
#include <algorithm>
#include "tests/test_support.h"
#include "opcheck/op_table.h"

using namespace duet;
using duet::testing::gradcheck;
using duet::testing::random_tensor;

namespace {
Tensor leaf(const Shape& s, uint64_t seed, double lo = -1.0, double hi = 1.0) {
  Tensor t = random_tensor(s, seed, DType::f64, lo, hi);
  t.set_requires_grad(true);
  return t;
}
// Empty string = gradients match; otherwise the worst mismatch is printed.
#define EXPECT_GRAD_OK(expr) EXPECT_EQ(std::string(), (expr))
}  // namespace

TEST(GradCheck, BinaryWithBroadcasting) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5}, {3, 5}}, {{2, 3, 4}, {4}}, {{2, 1, 5}, {3, 1}}, {{1}, {2, 3}}, {{4, 1, 3, 3}, {1, 5, 1, 1}}};
  for (const auto& [sa, sb] : shapes) {
    for (BinaryOp op : {BinaryOp::add, BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum, BinaryOp::minimum}) {
      Tensor a = leaf(sa, 1), b = leaf(sb, 2, 0.5, 1.5);  // b away from 0 for div
      EXPECT_GRAD_OK(gradcheck([op](const std::vector<Tensor>& in) { return binary(op, in[0], in[1]); }, {a, b}))
          << binary_name(op) << " " << shape_str(sa) << " " << shape_str(sb);
    }
  }
}

TEST(GradCheck, ScalarAndUnary) {
  Tensor x = leaf({3, 7}, 3, 0.2, 2.0);  // positive: log, sqrt, pow
  for (ScalarOp op : {ScalarOp::add, ScalarOp::mul, ScalarOp::pow, ScalarOp::rsub, ScalarOp::rdiv, ScalarOp::maximum,
                      ScalarOp::minimum})
    EXPECT_GRAD_OK(gradcheck([op](const std::vector<Tensor>& in) { return scalar_op(op, in[0], 1.3); }, {x}))
        << scalar_op_name(op);
  for (UnaryOp op : {UnaryOp::neg, UnaryOp::exp, UnaryOp::log, UnaryOp::sqrt, UnaryOp::rsqrt, UnaryOp::abs,
                     UnaryOp::tanh, UnaryOp::square})
    EXPECT_GRAD_OK(gradcheck([op](const std::vector<Tensor>& in) { return unary(op, in[0]); }, {x})) << unary_name(op);
}

TEST(GradCheck, Activations) {
  // Values kept away from the kinks (0 for relu, 0 and 6 for relu6, +-3 for hardswish).
  std::vector<double> v;
  for (int i = 0; i < 33; ++i) v.push_back(-7.9 + 0.5 * i + ((i % 3) ? 0.013 : 0.031));
  Tensor x = Tensor::from_vector(v, {3, 11}, DType::f64).set_requires_grad(true);
  for (Activation a : all_activations())
    EXPECT_GRAD_OK(gradcheck([a](const std::vector<Tensor>& in) { return activation(a, in[0]); }, {x}))
        << activation_name(a);
}

TEST(GradCheck, Reductions) {
  Tensor x = leaf({3, 4, 5}, 4);
  for (std::vector<int64_t> dims : std::vector<std::vector<int64_t>>{{}, {0}, {1, 2}, {-1}, {0, 2}}) {
    EXPECT_GRAD_OK(gradcheck([dims](const std::vector<Tensor>& in) { return sum(in[0], dims); }, {x}));
    EXPECT_GRAD_OK(gradcheck([dims](const std::vector<Tensor>& in) { return mean(in[0], dims, true); }, {x}));
    EXPECT_GRAD_OK(gradcheck([dims](const std::vector<Tensor>& in) { return amax(in[0], dims); }, {x}));
    EXPECT_GRAD_OK(gradcheck([dims](const std::vector<Tensor>& in) { return amin(in[0], dims); }, {x}));
  }
}

TEST(GradCheck, MatmulAndLinear) {
  const std::vector<std::pair<Shape, Shape>> shapes = {
      {{3, 5}, {5, 2}}, {{1, 4}, {4, 1}}, {{2, 3, 5}, {2, 5, 4}}, {{2, 3, 5}, {5, 4}}, {{2, 1, 3, 4}, {3, 4, 2}}};
  for (const auto& [sa, sb] : shapes) {
    Tensor a = leaf(sa, 5), b = leaf(sb, 6);
    EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); }, {a, b}))
        << shape_str(sa) << " @ " << shape_str(sb);
  }
  // transposed operands (attention's q @ k^T)
  Tensor q = leaf({2, 3, 4}, 7), k = leaf({2, 5, 4}, 8);
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return matmul(in[0], in[1].transpose(-1, -2)); }, {q, k}));
  for (bool bias : {true, false}) {
    Tensor x = leaf({2, 3, 5}, 9), w = leaf({4, 5}, 10), b = bias ? leaf({4}, 11) : Tensor();
    EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return linear(in[0], in[1], in[2]); }, {x, w, b}));
  }
}

TEST(GradCheck, Conv2d) {
  struct Case {
    Shape x, w;
    Conv2dParams p;
    bool bias;
  };
  auto P = [](int64_t s, int64_t pad, int64_t d, int64_t g) {
    Conv2dParams p;
    p.stride_h = p.stride_w = s;
    p.pad_h = p.pad_w = pad;
    p.dilation_h = p.dilation_w = d;
    p.groups = g;
    return p;
  };
  Conv2dParams asym = P(1, 0, 1, 1);
  asym.stride_w = 2;
  asym.pad_h = 1;
  const std::vector<Case> cases = {
      {{2, 3, 5, 5}, {4, 3, 3, 3}, P(1, 1, 1, 1), true},    // 3x3 same padding
      {{1, 2, 7, 6}, {3, 2, 3, 3}, P(2, 1, 1, 1), false},   // batch 1, stride 2, non-square
      {{2, 4, 5, 5}, {4, 1, 3, 3}, P(1, 1, 1, 4), true},    // depthwise
      {{1, 4, 6, 6}, {6, 2, 3, 3}, P(1, 0, 2, 2), false},   // groups 2, dilation 2
      {{2, 3, 4, 4}, {5, 3, 1, 1}, P(1, 0, 1, 1), true},    // 1x1
      {{1, 2, 6, 7}, {2, 2, 2, 3}, asym, true},             // asymmetric stride/pad, non-square kernel
  };
  for (const Case& c : cases) {
    Tensor x = leaf(c.x, 12), w = leaf(c.w, 13), b = c.bias ? leaf({c.w[0]}, 14) : Tensor();
    const Conv2dParams p = c.p;
    EXPECT_GRAD_OK(gradcheck([p](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], p); }, {x, w, b}))
        << shape_str(c.x) << " * " << shape_str(c.w);
    // the same in channels-last memory
    Tensor xc = random_tensor(c.x, 12).contiguous(MemoryFormat::channels_last);
    Tensor xr = xc.detach().contiguous().set_requires_grad(true);
    EXPECT_GRAD_OK(gradcheck(
        [p](const std::vector<Tensor>& in) { return conv2d(in[0].contiguous(MemoryFormat::channels_last), in[1], in[2], p); },
        {xr, w, b}))
        << "channels-last " << shape_str(c.x);
  }
}

// A KxK convolution over a 1x1 map runs as the 1x1 convolution with the one tap that sees the
// input (engine/ops/conv.cpp); its output and all three gradients must equal the same convolution
// over the map zero-padded by hand (a map big enough that the rewrite does not apply), including
// zero gradients for the taps that only ever see padding.
TEST(GradCheck, KernelOverOneByOneMapIsItsTap) {
  BackendGuard guard(DeviceType::cpu, Backend::reference);
  struct Case {
    int64_t k, pad, dilation, groups;
  };
  for (const Case c : {Case{3, 1, 1, 1}, Case{3, 2, 2, 1}, Case{5, 2, 1, 1}, Case{3, 1, 1, 4}}) {
    Conv2dParams p;
    p.pad_h = p.pad_w = c.pad;
    p.dilation_h = p.dilation_w = c.dilation;
    p.groups = c.groups;
    const int64_t n = 2, C = 8, O = 12, side = 2 * c.pad + 1;
    Tensor x = leaf({n, C, 1, 1}, 21), w = leaf({O, C / c.groups, c.k, c.k}, 22), b = leaf({O}, 23);
    const Tensor y = conv2d(x, w, b, p);
    const Tensor r = random_tensor(y.shape(), 24, DType::f64);
    sum(mul(y, r)).backward();
    // The same input placed in the middle of a zero map of side 2*pad + 1, convolved without padding.
    std::vector<double> big(static_cast<size_t>(n * C * side * side), 0.0);
    const std::vector<double> xv = x.detach().to_vector<double>();
    for (int64_t i = 0; i < n * C; ++i) big[static_cast<size_t>(i * side * side + c.pad * side + c.pad)] = xv[static_cast<size_t>(i)];
    Tensor xp = Tensor::from_vector<double>(big, {n, C, side, side}, TensorOptions(DType::f64)).set_requires_grad(true);
    Tensor w2 = w.detach().set_requires_grad(true), b2 = b.detach().set_requires_grad(true);
    Conv2dParams q = p;
    q.pad_h = q.pad_w = 0;
    const Tensor y2 = conv2d(xp, w2, b2, q);
    sum(mul(y2, r)).backward();
    ASSERT_EQ(y.shape(), y2.shape());
    EXPECT_EQ(y.to_vector<double>(), y2.to_vector<double>()) << "k " << c.k << " pad " << c.pad;
    EXPECT_EQ(w.grad().to_vector<double>(), w2.grad().to_vector<double>()) << "k " << c.k << " pad " << c.pad;
    EXPECT_EQ(b.grad().to_vector<double>(), b2.grad().to_vector<double>());
    const std::vector<double> gxp = xp.grad().to_vector<double>(), gx = x.grad().to_vector<double>();
    for (int64_t i = 0; i < n * C; ++i)
      EXPECT_EQ(gx[static_cast<size_t>(i)], gxp[static_cast<size_t>(i * side * side + c.pad * side + c.pad)]);
  }
}

TEST(GradCheck, BatchNorm) {
  for (const Shape& s : {Shape{3, 2, 3, 4}, Shape{5, 3}, Shape{1, 2, 3, 3}}) {
    const int64_t C = s[1];
    Tensor x = leaf(s, 15), g = leaf({C}, 16, 0.5, 1.5), b = leaf({C}, 17);
    BatchNormParams train;
    EXPECT_GRAD_OK(gradcheck(
        [train](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), train); },
        {x, g, b}))
        << "training " << shape_str(s);
    BatchNormParams eval;
    eval.training = false;
    Tensor rm = random_tensor({C}, 18), rv = random_tensor({C}, 19, DType::f64, 0.5, 2.0);
    EXPECT_GRAD_OK(gradcheck(
        [eval, rm, rv](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm, rv, eval); },
        {x, g, b}))
        << "eval " << shape_str(s);
  }
}

// The fused ReLU of conv2d and the fused ReLU and ReLU6 of batch_norm: their gradients are the
// unfused pairs'. Inputs are shifted away from the kinks at 0 (and 6), where finite differences
// are meaningless.
TEST(GradCheck, FusedReluOfConvAndBatchNorm) {
  Tensor x = leaf({2, 3, 5, 5}, 21), w = leaf({4, 3, 3, 3}, 22), b = leaf({4}, 23, 0.2, 0.6);
  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  p.act = Activation::relu;
  EXPECT_GRAD_OK(gradcheck([p](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], p); }, {x, w, b}));
  // The whole epilogue: y = relu6(conv(x) + b + residual), the residual's gradient included.
  Conv2dParams q = p;
  q.act = Activation::relu6;
  Tensor r = leaf({2, 4, 5, 5}, 29, 1.0, 2.0);
  EXPECT_GRAD_OK(
      gradcheck([q](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], q, in[3]); }, {x, w, b, r}));
  Tensor xb = leaf({3, 2, 3, 4}, 24), bb = leaf({2}, 26, 0.1, 0.3);
  for (Activation act : {Activation::relu, Activation::relu6}) {
    // ReLU6's scale puts some outputs above 6, so its upper clamp is checked too.
    Tensor g = act == Activation::relu ? leaf({2}, 25, 0.5, 1.5) : leaf({2}, 25, 5.0, 6.0);
    for (bool training : {true, false}) {
      BatchNormParams bp;
      bp.training = training;
      bp.act = act;
      Tensor rm = random_tensor({2}, 27), rv = random_tensor({2}, 28, DType::f64, 0.5, 2.0);
      const auto f = [bp, rm, rv](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm, rv, bp); };
      if (act == Activation::relu6) {
        NoGradGuard no_grad;
        BackendGuard reference(DeviceType::cpu, Backend::reference);  // f64, as gradcheck runs it
        const std::vector<double> y = f({xb, g, bb}).to_vector<double>();
        EXPECT_GT(std::count_if(y.begin(), y.end(), [](double v) { return v >= 6.0; }), 0)
            << "no output at ReLU6's upper clamp";
      }
      EXPECT_GRAD_OK(gradcheck(f, {xb, g, bb})) << activation_name(act) << (training ? " training" : " eval");
    }
  }
}

TEST(GradCheck, LayerNorm) {
  for (const Shape& s : {Shape{4, 7}, Shape{2, 3, 5}, Shape{1, 1, 9}}) {
    Tensor x = leaf(s, 20), g = leaf({s.back()}, 21, 0.5, 1.5), b = leaf({s.back()}, 22);
    EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], in[1], in[2]); }, {x, g, b}));
    EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return layer_norm(in[0], Tensor(), Tensor()); }, {x}));
  }
}

TEST(GradCheck, Pooling) {
  const auto P = opcheck::square_pool;
  for (const Pool2dParams& p : {P(2, 2, 0, false, true), P(3, 2, 1, false, true), P(3, 2, 1, true, false), P(3, 1, 1, false, false)}) {
    Tensor x = leaf({2, 3, 7, 6}, 23);  // random values: ties in max pooling have probability 0
    EXPECT_GRAD_OK(gradcheck([p](const std::vector<Tensor>& in) { return max_pool2d(in[0], p); }, {x}));
    EXPECT_GRAD_OK(gradcheck([p](const std::vector<Tensor>& in) { return avg_pool2d(in[0], p); }, {x}));
  }
  Tensor x = leaf({1, 2, 7, 5}, 24);
  for (auto [oh, ow] : std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {3, 2}, {7, 5}, {4, 4}})
    EXPECT_GRAD_OK(gradcheck([oh, ow](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], oh, ow); }, {x}));
}

TEST(GradCheck, SoftmaxAndCrossEntropy) {
  Tensor x = leaf({3, 4, 5}, 25, -2.0, 2.0);
  for (int64_t d : {0, 1, 2, -1}) {
    EXPECT_GRAD_OK(gradcheck([d](const std::vector<Tensor>& in) { return softmax(in[0], d); }, {x})) << d;
    EXPECT_GRAD_OK(gradcheck([d](const std::vector<Tensor>& in) { return log_softmax(in[0], d); }, {x})) << d;
  }
  Tensor logits = leaf({4, 6}, 26, -3.0, 3.0);
  Tensor target = Tensor::from_vector<int64_t>({0, 5, 2, 2}, {4});
  for (double ls : {0.0, 0.1})
    EXPECT_GRAD_OK(gradcheck([&](const std::vector<Tensor>& in) { return cross_entropy(in[0], target, ls); }, {logits}));
}

TEST(GradCheck, DropoutUsesItsMask) {
  Tensor x = leaf({4, 9}, 27);
  // The same generator state for every evaluation, so the mask is fixed during the check.
  EXPECT_GRAD_OK(gradcheck(
      [](const std::vector<Tensor>& in) {
        Generator g(99);
        return dropout(in[0], 0.3, true, &g);
      },
      {x}));
}

TEST(GradCheck, ShapeOps) {
  Tensor a = leaf({2, 3, 4}, 28), b = leaf({2, 2, 4}, 29);
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return cat({in[0], in[1]}, 1); }, {a, b}));
  EXPECT_GRAD_OK(gradcheck(
      [](const std::vector<Tensor>& in) {
        auto parts = split(in[0], {1, 2}, 1);
        return add(mul(parts[0], 2.0), sum(parts[1], {1}, true));
      },
      {a}));
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return in[0].permute({2, 0, 1}).reshape({4, 6}); }, {a}));
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return in[0].slice(2, 1, 4, 2).transpose(0, 1); }, {a}));
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return in[0].select(1, 2).unsqueeze(0).expand({3, 2, 4}); }, {a}));
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return in[0].contiguous(MemoryFormat::channels_last); },
                           {leaf({2, 3, 2, 2}, 30)}));
  EXPECT_GRAD_OK(gradcheck([](const std::vector<Tensor>& in) { return chunk(in[0], 3, 2)[1]; }, {a}));
}

TEST(GradCheck, CompositeAttention) {
  // A small self-attention block: every view, matmul and softmax gradient composed.
  Tensor x = leaf({2, 3, 4}, 31), w = leaf({12, 4}, 32);
  EXPECT_GRAD_OK(gradcheck(
      [](const std::vector<Tensor>& in) {
        Tensor qkv = linear(in[0], in[1]).reshape({2, 3, 3, 2, 2}).permute({2, 0, 3, 1, 4});
        Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), v = qkv.select(0, 2);
        Tensor att = softmax(mul(matmul(q, k.transpose(-2, -1)), 0.7), -1);
        return matmul(att, v).transpose(1, 2).reshape({2, 3, 4});
      },
      {x, w}));
}
