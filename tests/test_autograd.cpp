// The autograd engine: accumulation, shared subgraphs, NoGradGuard, detach, leaf rules and the
// errors for misuse.
#include "tests/test_support.h"

using namespace duet;
using duet::testing::all_close;

namespace {
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(Autograd, SimpleChainAndAccumulation) {
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}, TensorOptions(DType::f64).with_grad(true));
  Tensor y = sum(mul(x, x));  // dy/dx = 2x
  y.backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{2, 4, 6}));
  sum(mul(x, 3.0)).backward();  // accumulates: + 3
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{5, 7, 9}));
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
}

TEST(Autograd, DiamondGraphSumsBothPaths) {
  Tensor x = Tensor::from_vector<double>({0.5, -1.0}, {2}, TensorOptions(DType::f64).with_grad(true));
  Tensor a = exp(x);
  Tensor y = sum(add(mul(a, 2.0), square(a)));  // d/dx = 2e^x + 2e^{2x}
  y.backward();
  const std::vector<double> g = x.grad().to_vector<double>();
  for (int i = 0; i < 2; ++i) {
    const double xv = i == 0 ? 0.5 : -1.0;
    EXPECT_NEAR(g[i], 2 * std::exp(xv) + 2 * std::exp(2 * xv), 1e-12);
  }
}

TEST(Autograd, NoGradGuardAndDetach) {
  Tensor x = Tensor::ones({2}, TensorOptions().with_grad(true));
  {
    NoGradGuard ng;
    Tensor y = mul(x, 2.0);
    EXPECT_FALSE(y.requires_grad());
    EXPECT_FALSE(y.grad_fn());
  }
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.storage(), x.storage());
  Tensor y = mul(add(x, d), 1.0);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<float>(), (std::vector<float>{1, 1}));  // nothing flows through d
}

TEST(Autograd, OnlyNeededGradientsAreComputed) {
  Tensor x = Tensor::ones({1, 2, 4, 4});
  Tensor w = Tensor::ones({3, 2, 3, 3}, TensorOptions().with_grad(true));
  profiler::clear();
  profiler::enable(true);
  sum(conv2d(x, w)).backward();
  profiler::enable(false);
  bool data_grad = false, weight_grad = false;
  for (const OpEvent& e : profiler::collect()) {
    data_grad |= std::string(e.name) == "conv2d.backward_data";
    weight_grad |= std::string(e.name) == "conv2d.backward_weight";
  }
  profiler::clear();
  EXPECT_FALSE(data_grad) << "the input does not require grad: no backward_data should run";
  EXPECT_TRUE(weight_grad);
  EXPECT_EQ(w.grad().shape(), w.shape());
}

TEST(Autograd, UnusedOutputsOfSplitGetZeroGradient) {
  Tensor x = Tensor::arange(6, DType::f64).set_requires_grad(true);
  auto parts = split(x, {2, 4}, 0);
  sum(parts[1]).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{0, 0, 1, 1, 1, 1}));
}

TEST(Autograd, MisuseGivesClearErrors) {
  Tensor x = Tensor::ones({2, 3}, TensorOptions().with_grad(true));
  Tensor y = mul(x, 2.0);
  std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("[2, 3]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gradient argument"), std::string::npos) << msg;

  Tensor c = Tensor::ones({3});
  msg = error_of([&] { sum(c).backward(); });
  EXPECT_NE(msg.find("does not require grad"), std::string::npos) << msg;

  Tensor z = sum(mul(x, x));
  z.backward();
  msg = error_of([&] { z.backward(); });
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << msg;

  Tensor r = sum(mul(x, x));
  r.backward(Tensor(), /*retain_graph=*/true);
  EXPECT_NO_THROW(r.backward());

  msg = error_of([&] { y.backward(Tensor::ones({3, 2})); });
  EXPECT_NE(msg.find("expected the output's shape [2, 3]"), std::string::npos) << msg;

  msg = error_of([&] { Tensor::ones({2}, DType::i64).set_requires_grad(true); });
  EXPECT_NE(msg.find("i64"), std::string::npos) << msg;

  msg = error_of([&] { y.set_requires_grad(false); });
  EXPECT_NE(msg.find("non-leaf"), std::string::npos) << msg;
}

TEST(Autograd, GraphIsFreedAfterBackward) {
  // Saved tensors are released by backward: memory returns to its level before the forward.
  Tensor w = Tensor::ones({256, 256}, TensorOptions().with_grad(true));
  const int64_t before = cpu_allocator().stats().current;
  {
    Tensor x = Tensor::ones({8, 256});
    Tensor loss = sum(relu(linear(x, w)));
    loss.backward();
  }
  w.zero_grad();
  EXPECT_EQ(cpu_allocator().stats().current, before);
}

TEST(Autograd, OpsKeepOnlyWhatTheirGradientReads) {
  // A residual add, a scalar multiply and a negation need none of their operands for backward;
  // an exp needs its output only. Once the forward's intermediates go out of scope, only those
  // saved tensors stay alive (before this was fixed, every op's backward held its inputs and
  // output: a residual add pinned three activations until backward).
  const Tensor x = Tensor::ones({1024}, TensorOptions().with_grad(true));  // 4 KiB each
  const int64_t before = cpu_allocator().stats().current;
  Tensor y;
  {
    Tensor a = mul(x, 2.0);
    Tensor b = add(a, neg(a));
    y = exp(b);  // saves its output: y itself
  }
  EXPECT_EQ(cpu_allocator().stats().current - before, 4096);
  sum(y).backward();
  // d/dx exp(2x - 2x) = 0
  for (double v : x.grad().to_vector<double>()) EXPECT_EQ(v, 0.0);
}

TEST(Autograd, GradientsReachingOneTensorAreSummedCorrectly) {
  // Three consumers of one tensor, one of them through cat (whose backward hands out views of a
  // shared buffer), and one gradient handed to both inputs of an add: the in-place accumulation
  // must never write into a buffer another gradient still reads.
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3}).set_requires_grad(true);
  const Tensor h = mul(x, 1.0);
  const Tensor c = cat({h, h, mul(h, 2.0)}, 1);  // [2, 9]
  const Tensor s = add(h, h);
  const Tensor loss = add(sum(mul(c, c)), sum(s));
  loss.backward();
  // loss = sum(h^2) * 2 + sum((2h)^2) + 2 sum(h) = 6 sum(h^2) + 2 sum(h): d/dx = 12 x + 2
  const std::vector<double> g = x.grad().to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) EXPECT_DOUBLE_EQ(g[i], 12.0 * double(i + 1) + 2.0) << i;
}

// k's gradient in q @ k^T: the matmul computes it in k's own layout and the transpose's backward
// hands it to the leaf as is, so no copy runs; and the gradient is right.
TEST(Autograd, GradientThroughATransposedViewNeedsNoCopy) {
  const Tensor q = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  const Tensor k = Tensor::from_vector<float>({1, -1, 2, 0.5f}, {2, 2}).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  const Tensor y = matmul(q, k.transpose(-1, -2));
  y.backward(Tensor::ones(y.shape()));
  profiler::enable(false);
  std::string ops;
  for (const OpEvent& e : profiler::collect()) ops += std::string(e.name) + " ";
  profiler::clear();
  EXPECT_EQ(ops.find("copy"), std::string::npos) << ops;
  // d/dk[j, c] of sum_ij q[i, :] . k[j, :] = sum_i q[i, c]
  EXPECT_TRUE(k.grad().is_contiguous());
  EXPECT_EQ(k.grad().to_vector<float>(), (std::vector<float>{9, 12, 9, 12}));
}

// k as attention has it, a strided slice of the packed qkv buffer: q @ k^T copies k along its rows
// (k's shape, not k^T's), and the gradient of k comes out in k's orientation, so writing it into
// the packed buffer's gradient is a row copy too. Values as with a contiguous k.
TEST(Autograd, AStridedTransposedOperandIsCopiedAlongItsRows) {
  const Tensor packed = duet::testing::random_tensor({2, 5, 2, 4}, 3, DType::f32).set_requires_grad(true);
  const Tensor q = duet::testing::random_tensor({2, 5, 4}, 4, DType::f32);
  const Tensor wl = duet::testing::random_tensor({2, 5, 5}, 5, DType::f32);
  profiler::clear();
  profiler::enable(true);
  const Tensor y = matmul(q, packed.select(2, 1).transpose(-1, -2));
  sum(mul(y, wl)).backward();
  profiler::enable(false);
  std::string copies;
  for (const OpEvent& e : profiler::collect())
    if (std::string(e.name) == "copy") copies += e.shapes + " ";
  profiler::clear();
  EXPECT_NE(copies.find("[2, 5, 4]"), std::string::npos) << copies;
  EXPECT_EQ(copies.find("[2, 4, 5]"), std::string::npos) << copies;
  const Tensor k2 = packed.detach().select(2, 1).contiguous().set_requires_grad(true);
  sum(mul(matmul(q, k2.transpose(-1, -2)), wl)).backward();
  EXPECT_TRUE(all_close(y, matmul(q, k2.detach().transpose(-1, -2)), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(packed.grad().select(2, 1), k2.grad(), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(packed.grad().select(2, 0), Tensor::zeros({2, 5, 4}), 0, 0));
}

// attention() runs the fused op where the backend has it (cpu in f32 on AVX-512, reference), with no
// copy at all, and agrees with the same maths written as matmul and softmax: values and the packed gradient.
TEST(Autograd, FusedAttentionMatchesTheComposedMaths) {
  const int64_t N = 2, S = 9, H = 3, Dh = 8, D = H * Dh;
  const Tensor qkv = duet::testing::random_tensor({N, S, 3 * D}, 11, DType::f32).set_requires_grad(true);
  const Tensor w = duet::testing::random_tensor({N, S, D}, 12, DType::f32);
  profiler::clear();
  profiler::enable(true);
  const Tensor y = attention(qkv, H);
  sum(mul(y, w)).backward();
  profiler::enable(false);
  std::string ops;
  for (const OpEvent& e : profiler::collect()) ops += std::string(e.name) + " ";
  profiler::clear();
  if (backend(qkv.backend()).fuses_attention(DType::f32)) {  // cpu (AVX-512) or reference
    EXPECT_NE(ops.find("attention "), std::string::npos) << ops;
    EXPECT_NE(ops.find("attention.backward"), std::string::npos) << ops;
    EXPECT_EQ(ops.find("copy"), std::string::npos) << ops;
    EXPECT_EQ(ops.find("matmul"), std::string::npos) << ops;
  }
  // The composed maths, on copies of the leaves.
  const Tensor x2 = qkv.detach().clone().set_requires_grad(true);
  const std::vector<Tensor> p = unbind(x2.view({N, S, 3, H, Dh}).permute({2, 0, 3, 1, 4}), 0);
  const Tensor probs = softmax(mul(matmul(p[0], p[1].transpose(-1, -2)), 1.0 / std::sqrt(double(Dh))), -1);
  const Tensor y2 = matmul(probs, p[2]).permute({0, 2, 1, 3}).reshape({N, S, D});
  sum(mul(y2, w)).backward();
  EXPECT_TRUE(all_close(y, y2, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(qkv.grad(), x2.grad(), 1e-5, 1e-5));
}

TEST(Autograd, AttentionRejectsAShapeItCannotSplit) {
  const Tensor qkv = Tensor::zeros({2, 4, 20});
  try {
    (void)attention(qkv, 3);
    FAIL() << "expected a duet::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("last dim must be 3 * heads * head_dim with heads = 3"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW((void)attention(Tensor::zeros({4, 18}), 2), Error);
  EXPECT_THROW((void)attention(Tensor::zeros({2, 4, 18}), 0), Error);
}

// The parts of unbind (and split) share one node: their gradients land in one buffer laid out
// like the input, with no zero-filled buffer per part and no adds; an unused part gets zeros.
TEST(Autograd, UnbindWritesEveryPartsGradientIntoOneBuffer) {
  const Tensor base = Tensor::arange(24, DType::f32).reshape({2, 3, 4}).set_requires_grad(true);
  const Tensor x = base.permute({1, 0, 2});  // [3, 2, 4], not contiguous: like attention's qkv
  profiler::clear();
  profiler::enable(true);
  const std::vector<Tensor> parts = unbind(x, 0);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].shape(), (Shape{2, 4}));
  add(sum(mul(parts[0], 2.0)), sum(mul(parts[2], 3.0))).backward();  // parts[1] unused
  profiler::enable(false);
  std::string ops;
  for (const OpEvent& e : profiler::collect())
    if (e.phase == Phase::backward) ops += std::string(e.name) + " ";
  profiler::clear();
  EXPECT_EQ(ops.find("add"), std::string::npos) << ops;
  // base[i, j, k] is part j's element [i, k]: gradient 2, 0, 3 for j = 0, 1, 2.
  const std::vector<float> g = base.grad().to_vector<float>();
  for (int i = 0; i < 24; ++i) EXPECT_EQ(g[i], (std::vector<float>{2, 0, 3})[(i / 4) % 3]) << i;
  EXPECT_TRUE(base.grad().is_contiguous());

  const Tensor y = Tensor::arange(6, DType::f64).set_requires_grad(true);
  const std::vector<Tensor> halves = split(y, {2, 4}, 0);
  add(sum(halves[0]), sum(mul(halves[1], -1.0))).backward();
  EXPECT_EQ(y.grad().to_vector<double>(), (std::vector<double>{1, 1, -1, -1, -1, -1}));
}

// The post-accumulate-grad hook data-parallel training overlaps communication with: each leaf is
// reported once, when its gradient is final, while earlier layers' gradients are still to come.
TEST(Autograd, LeafGradHookReportsEachLeafOnceWhenItsGradientIsFinal) {
  const TensorOptions o = TensorOptions(DType::f64).with_grad(true);
  Tensor x = Tensor::from_vector<double>({1, 2, 3}, {3}, TensorOptions(DType::f64));
  Tensor w1 = Tensor::from_vector<double>({0.5, -1, 2}, {3}, o);
  Tensor w2 = Tensor::from_vector<double>({1.5, 0.25, -3}, {3}, o);
  Tensor w3 = Tensor::from_vector<double>({2, 2, -0.5}, {3}, o);
  // A chain of layers, and w2 used a second time: its gradient is the sum of two paths.
  Tensor y = add(sum(mul(mul(mul(x, w1), w2), w3)), sum(mul(w2, w2)));
  std::vector<TensorImpl*> order;
  std::vector<std::vector<double>> at_report;
  std::vector<bool> w1_done_then;
  {
    const LeafGradHookGuard hook([&](TensorImpl* leaf) {
      order.push_back(leaf);
      at_report.push_back(leaf->grad.to_vector<double>());
      w1_done_then.push_back(w1.grad().defined());
    });
    y.backward();
  }
  ASSERT_EQ(order.size(), 3u);
  // The chain finishes from the last layer back: w3 first, w1 last.
  EXPECT_EQ(order.front(), w3.impl());
  EXPECT_EQ(order.back(), w1.impl());
  EXPECT_FALSE(w1_done_then.front()) << "w3 must be reported before backward reaches w1";
  const std::vector<Tensor> leaves{w1, w2, w3};
  for (size_t i = 0; i < order.size(); ++i) {
    const Tensor* leaf = nullptr;
    for (const Tensor& w : leaves)
      if (w.impl() == order[i]) leaf = &w;
    ASSERT_NE(leaf, nullptr);
    EXPECT_EQ(at_report[i], leaf->grad().to_vector<double>()) << "reported before its gradient was final";
  }
  // d/dw2 = x*w1*w3 + 2*w2
  EXPECT_EQ(w2.grad().to_vector<double>(), (std::vector<double>{1 * 0.5 * 2 + 3, 2 * -1 * 2 + 0.5, 3 * 2 * -0.5 - 6}));

  // Without a guard nothing listens; guards nest and restore the outer hook.
  int outer = 0, inner = 0;
  {
    const LeafGradHookGuard a([&](TensorImpl*) { ++outer; });
    {
      const LeafGradHookGuard b([&](TensorImpl*) { ++inner; });
      sum(mul(w1, w1)).backward();
    }
    sum(mul(w1, w3)).backward();
  }
  sum(w1).backward();
  EXPECT_EQ(inner, 1);
  EXPECT_EQ(outer, 2);
}
