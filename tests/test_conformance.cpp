// Conformance of the `cpu` backend (oneDNN + OpenMP) against the `reference` backend (plain loops):
// every op, through the public front-ends, forward and backward, on shapes chosen to reach the
// awkward paths (odd sizes, batch 1, 1x1/3x3/7x7 kernels, stride, dilation, groups, depthwise,
// channels-last, transposed and strided views, broadcasting, sizes past the OpenMP grain).
// Each case builds the same f32 leaves under both backends, runs the op, backpropagates
// sum(out * R) for a fixed random R, and compares outputs and gradients.
//
// The same table is run in a second mode, GradientMatchesFiniteDifferences: each case's gradients
// in f64 on the reference backend against central differences along random directions. So a case
// added to the table is checked both ways.
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>
#include "tests/test_support.h"
#ifdef DUET_HAVE_DNNL
#include "backends/cpu/conv_algorithm.h"
#include "backends/cpu/depthwise.h"
#include "backends/cpu/small_gemm.h"
#endif
#ifdef DUET_HAVE_DNNL
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/threads.h"
#endif

namespace duet {
namespace {

using testing::all_close;
using testing::random_tensor;

// How a leaf becomes the op's input: the leaf holds the gradient, the view is what the op sees.
enum class Layout { plain, channels_last, transposed, strided, expanded };

struct In {
  Shape shape;
  Layout layout = Layout::plain;
  bool grad = true;
  double lo = -1.0, hi = 1.0;
  Shape expand_to = {};     // Layout::expanded: the broadcast shape
  int64_t classes = 0;      // > 0: i64 labels in [0, classes) (no gradient)
};

using Fn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;

struct Case {
  std::string name;
  std::vector<In> ins;
  Fn f;
  double tol = 1.0;  // multiplies atol 1e-5 and rtol 1e-4 (long f32 reductions)
  // Also checked against finite differences in f64 (false where the case rounds to a narrower
  // dtype on purpose, which no finite difference survives).
  bool gradient_check = true;
};

struct Result {
  std::vector<Tensor> outs, grads;
};

Tensor make_leaf(const In& in, uint64_t seed, DType dtype = DType::f32) {
  if (in.classes > 0) {
    std::vector<int64_t> v(static_cast<size_t>(numel_of(in.shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + seed * 3) % in.classes);
    return Tensor::from_vector<int64_t>(v, in.shape, TensorOptions(DType::i64));
  }
  Shape s = in.shape;
  if (in.layout == Layout::transposed) std::swap(s[s.size() - 1], s[s.size() - 2]);
  if (in.layout == Layout::strided) s.back() *= 2;
  Tensor t = random_tensor(s, seed, dtype, in.lo, in.hi);
  if (in.layout == Layout::channels_last) {
    BackendGuard ref(DeviceType::cpu, Backend::reference);
    t = t.contiguous(MemoryFormat::channels_last).detach();
  }
  if (in.grad) t.set_requires_grad(true);
  return t;
}

Tensor view_of(const In& in, const Tensor& leaf) {
  switch (in.layout) {
    case Layout::transposed: return leaf.transpose(-1, -2);
    case Layout::strided: return leaf.slice(-1, 0, leaf.size(-1), 2);
    case Layout::expanded: return leaf.expand(in.expand_to);
    default: return leaf;
  }
}

Result run(const Case& c, Backend b) {
  std::vector<Tensor> leaves, views;
  for (size_t i = 0; i < c.ins.size(); ++i) leaves.push_back(make_leaf(c.ins[i], 1000 + 17 * i));
  // Fixed random weights for the backward seed, made once with the reference backend.
  BackendGuard guard(DeviceType::cpu, b);
  for (size_t i = 0; i < c.ins.size(); ++i) views.push_back(view_of(c.ins[i], leaves[i]));
  Result r;
  r.outs = c.f(views);
  Tensor loss;
  for (size_t i = 0; i < r.outs.size(); ++i) {
    const Tensor& o = r.outs[i];
    if (!o.requires_grad() || !is_floating(o.dtype())) continue;
    Tensor R;
    {
      BackendGuard ref(DeviceType::cpu, Backend::reference);
      R = random_tensor(o.shape(), 77 + i, o.dtype());
    }
    Tensor term = sum(mul(o, R));
    loss = loss.defined() ? add(loss, term) : term;
  }
  if (loss.defined()) loss.backward();
  for (const Tensor& l : leaves) r.grads.push_back(l.requires_grad() ? l.grad() : Tensor());
  for (Tensor& o : r.outs) o = o.detach();
  return r;
}

// gtest prints a parameter with this instead of its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Conformance : public ::testing::TestWithParam<Case> {};

void expect_cpu_matches_reference(const Case& c) {
  const Result ref = run(c, Backend::reference);
  const Result cpu = run(c, Backend::cpu);
  const double atol = 1e-5 * c.tol, rtol = 1e-4 * c.tol;
  ASSERT_EQ(ref.outs.size(), cpu.outs.size());
  for (size_t i = 0; i < ref.outs.size(); ++i) {
    ASSERT_EQ(ref.outs[i].dtype(), cpu.outs[i].dtype()) << "output " << i;
    EXPECT_EQ(ref.outs[i].shape(), cpu.outs[i].shape()) << "output " << i;
    if (ref.outs[i].dtype() == DType::i64)
      EXPECT_EQ(ref.outs[i].to_vector<int64_t>(), cpu.outs[i].to_vector<int64_t>()) << "output " << i;
    else
      EXPECT_TRUE(all_close(cpu.outs[i], ref.outs[i], atol, rtol)) << "output " << i;
  }
  for (size_t i = 0; i < ref.grads.size(); ++i) {
    ASSERT_EQ(ref.grads[i].defined(), cpu.grads[i].defined()) << "gradient of input " << i;
    if (ref.grads[i].defined()) {
      EXPECT_TRUE(all_close(cpu.grads[i], ref.grads[i], atol, rtol)) << "gradient of input " << i;
    }
  }
}

TEST_P(Conformance, CpuMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  expect_cpu_matches_reference(GetParam());
}

// ---- the cases ---------------------------------------------------------------------------------------

Fn one(std::function<Tensor(const std::vector<Tensor>&)> f) {
  return [f](const std::vector<Tensor>& v) { return std::vector<Tensor>{f(v)}; };
}

In cl(Shape s) { return In{s, Layout::channels_last}; }
In tr(Shape s) { return In{s, Layout::transposed}; }
In st(Shape s) { return In{s, Layout::strided}; }
In ex(Shape s, Shape to) { return In{s, Layout::expanded, true, -1, 1, to}; }
In pos(Shape s) { return In{s, Layout::plain, true, 0.2, 2.0}; }
In wide(Shape s, double lo, double hi) { return In{s, Layout::plain, true, lo, hi}; }

std::vector<Case> elementwise_cases() {
  std::vector<Case> v;
  const std::pair<const char*, BinaryOp> bins[] = {{"add", BinaryOp::add}, {"sub", BinaryOp::sub},
                                                   {"mul", BinaryOp::mul}, {"maximum", BinaryOp::maximum},
                                                   {"minimum", BinaryOp::minimum}};
  for (auto [name, op] : bins) {
    auto f = one([op = op](const std::vector<Tensor>& x) { return binary(op, x[0], x[1]); });
    const std::string n = name;
    v.push_back({n + "_same", {In{{5, 7}}, In{{5, 7}}}, f});
    v.push_back({n + "_row_broadcast", {In{{5, 7}}, In{{7}}}, f});
    v.push_back({n + "_col_broadcast", {In{{3, 1}}, In{{3, 6}}}, f});
    v.push_back({n + "_bias_nchw", {In{{2, 3, 5, 4}}, In{{1, 3, 1, 1}}}, f});
    v.push_back({n + "_bias_nhwc", {cl({2, 3, 5, 4}), In{{1, 3, 1, 1}}}, f});
    v.push_back({n + "_transposed", {tr({6, 9}), In{{6, 9}}}, f});
    v.push_back({n + "_strided", {st({4, 5}), In{{4, 5}}}, f});
    v.push_back({n + "_scalar", {In{{}}, In{{4, 3}}}, f});
    v.push_back({n + "_big_broadcast", {In{{64, 33, 40}}, In{{33, 1}}}, f});
  }
  auto div_f = one([](const std::vector<Tensor>& x) { return div(x[0], x[1]); });
  v.push_back({"div_same", {In{{5, 7}}, pos({5, 7})}, div_f});
  v.push_back({"div_broadcast", {cl({2, 3, 5, 4}), pos({3, 1, 1})}, div_f});
  v.push_back({"div_big", {In{{300, 257}}, pos({300, 257})}, div_f});
  // Dense operands simplify to one row, which the cpu loops cut into pieces per thread.
  v.push_back({"add_big_dense_nhwc", {cl({4, 37, 17, 19}), cl({4, 37, 17, 19})},
               one([](const std::vector<Tensor>& x) { return add(x[0], x[1]); })});
  v.push_back({"add_expanded_operand", {ex({1, 5}, {4, 5}), In{{4, 5}}},
               one([](const std::vector<Tensor>& x) { return add(x[0], x[1]); })});
  for (BinaryOp op : {BinaryOp::eq, BinaryOp::gt, BinaryOp::lt}) {
    In a{{6, 5}, Layout::plain, false}, b{{5}, Layout::plain, false};
    v.push_back({std::string("cmp_") + binary_name(op), {a, b},
                 one([op](const std::vector<Tensor>& x) { return binary(op, x[0], x[1]); })});
  }
  v.push_back({"eq_with_self", {In{{6, 5}, Layout::plain, false}},
               one([](const std::vector<Tensor>& x) { return eq(x[0], x[0]); })});

  const std::pair<const char*, std::function<Tensor(const Tensor&)>> scal[] = {
      {"add_scalar", [](const Tensor& x) { return add(x, 0.75); }},
      {"mul_scalar", [](const Tensor& x) { return mul(x, -1.5); }},
      {"pow2", [](const Tensor& x) { return pow(x, 2.0); }},
      {"pow3", [](const Tensor& x) { return pow(x, 3.0); }},
      {"rsub", [](const Tensor& x) { return rsub(x, 2.0); }},
      {"clamp_min", [](const Tensor& x) { return clamp_min(x, 0.1); }},
      {"clamp_max", [](const Tensor& x) { return clamp_max(x, -0.2); }},
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"square", [](const Tensor& x) { return square(x); }},
  };
  for (auto& [name, fn] : scal) {
    auto f = one([fn = fn](const std::vector<Tensor>& x) { return fn(x[0]); });
    v.push_back({std::string(name) + "_small", {In{{3, 5}}}, f});
    v.push_back({std::string(name) + "_nhwc", {cl({2, 3, 4, 5})}, f});
    v.push_back({std::string(name) + "_strided", {st({7, 6})}, f});
    v.push_back({std::string(name) + "_big", {In{{64, 1031}}}, f});
  }
  const std::pair<const char*, std::function<Tensor(const Tensor&)>> positive[] = {
      {"log", [](const Tensor& x) { return log(x); }},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }},
      {"rdiv", [](const Tensor& x) { return rdiv(x, 1.5); }},
      {"pow_half", [](const Tensor& x) { return pow(x, 0.5); }},
  };
  for (auto& [name, fn] : positive) {
    auto f = one([fn = fn](const std::vector<Tensor>& x) { return fn(x[0]); });
    v.push_back({std::string(name) + "_small", {pos({3, 5})}, f});
    v.push_back({std::string(name) + "_big", {pos({50, 1001})}, f});
  }
  for (Activation a : all_activations()) {
    auto f = one([a](const std::vector<Tensor>& x) { return activation(a, x[0]); });
    const std::string n = std::string("act_") + activation_name(a);
    v.push_back({n + "_small", {wide({3, 7}, -8, 8)}, f});
    v.push_back({n + "_nhwc", {In{{2, 5, 3, 3}, Layout::channels_last, true, -8, 8}}, f});
    v.push_back({n + "_strided", {In{{5, 4}, Layout::strided, true, -8, 8}}, f});
    v.push_back({n + "_big", {wide({8, 64, 129}, -8, 8)}, f});
  }
  return v;
}

std::vector<Case> reduction_cases() {
  std::vector<Case> v;
  const std::pair<const char*, std::vector<int64_t>> dims[] = {
      {"all", {}}, {"d0", {0}}, {"d1", {1}}, {"dlast", {-1}}, {"d023", {0, 2, 3}}, {"d12", {1, 2}}, {"d13", {1, 3}}};
  const std::pair<const char*, std::function<Tensor(const Tensor&, std::vector<int64_t>)>> ops[] = {
      {"sum", [](const Tensor& x, std::vector<int64_t> d) { return sum(x, d); }},
      {"mean", [](const Tensor& x, std::vector<int64_t> d) { return mean(x, d, true); }},
      {"amax", [](const Tensor& x, std::vector<int64_t> d) { return amax(x, d); }},
      {"amin", [](const Tensor& x, std::vector<int64_t> d) { return amin(x, d); }},
  };
  for (auto& [oname, fn] : ops)
    for (auto& [dname, d] : dims) {
      auto f = one([fn = fn, d = d](const std::vector<Tensor>& x) { return fn(x[0], d); });
      const std::string n = std::string(oname) + "_" + dname;
      v.push_back({n, {In{{3, 4, 5, 6}}}, f});
      v.push_back({n + "_nhwc", {cl({3, 4, 5, 6})}, f});
      v.push_back({n + "_big", {In{{16, 32, 12, 13}}}, f, 2.0});
      v.push_back({n + "_nhwc_big", {cl({16, 32, 12, 13})}, f, 2.0});  // past the OpenMP grain, no copy
    }
  // Channels-last bias-gradient pattern (N, H, W reduced: rows of C), wide C, and a transposed view.
  v.push_back({"sum_nhwc_bias_grad", {cl({8, 300, 9, 11})}, one([](const std::vector<Tensor>& x) { return sum(x[0], {0, 2, 3}); }), 2.0});
  v.push_back({"mean_nhwc_hw", {cl({4, 40, 33, 35})}, one([](const std::vector<Tensor>& x) { return mean(x[0], {2, 3}); }), 2.0});
  v.push_back({"sum_transposed_d0", {tr({300, 257})}, one([](const std::vector<Tensor>& x) { return sum(x[0], {0}); }), 2.0});
  v.push_back({"amax_transposed_d1", {tr({300, 257})}, one([](const std::vector<Tensor>& x) { return amax(x[0], {1}); })});
  auto sum_rows = one([](const std::vector<Tensor>& x) { return sum(x[0], {0}); });
  v.push_back({"sum_bias_grad_shape", {In{{4096, 24}}}, sum_rows, 2.0});
  v.push_back({"sum_few_long_rows", {In{{2, 70000}}}, one([](const std::vector<Tensor>& x) { return sum(x[0], {1}); }), 2.0});
  v.push_back({"sum_to_broadcast", {In{{2, 3, 4}}}, one([](const std::vector<Tensor>& x) { return sum_to(x[0], {3, 1}); })});
  for (int64_t d : {0, 1, -1}) {
    In a{{7, 9, 11}, Layout::plain, false};
    v.push_back({"argmax_d" + std::to_string(d + 1), {a},
                 one([d](const std::vector<Tensor>& x) { return argmax(x[0], d); })});
  }
  v.push_back({"argmax_big", {In{{256, 1000}, Layout::plain, false}},
               one([](const std::vector<Tensor>& x) { return argmax(x[0], 1); })});
  // One output row of 40,000: the cpu loops cut a single row into pieces per thread.
  v.push_back({"argmax_dim0_wide", {In{{3, 40000}, Layout::plain, false}},
               one([](const std::vector<Tensor>& x) { return argmax(x[0], 0); })});
  for (int64_t d : {0, 1, 2, 3}) {
    In a{{4, 19, 6, 7}, Layout::channels_last, false};
    v.push_back({"argmax_nhwc_d" + std::to_string(d), {a}, one([d](const std::vector<Tensor>& x) { return argmax(x[0], d); })});
  }
  v.push_back({"argmax_nchw_channels_big", {In{{8, 21, 33, 35}, Layout::plain, false}},
               one([](const std::vector<Tensor>& x) { return argmax(x[0], 1); })});
  v.push_back({"argmax_nhwc_channels_big", {In{{8, 21, 33, 35}, Layout::channels_last, false}},
               one([](const std::vector<Tensor>& x) { return argmax(x[0], 1); })});
  return v;
}

std::vector<Case> linalg_cases() {
  std::vector<Case> v;
  auto mm = one([](const std::vector<Tensor>& x) { return matmul(x[0], x[1]); });
  v.push_back({"matmul_2d", {In{{7, 5}}, In{{5, 3}}}, mm});
  v.push_back({"matmul_1x1", {In{{1, 1}}, In{{1, 1}}}, mm});
  v.push_back({"matmul_batched", {In{{3, 4, 5}}, In{{3, 5, 6}}}, mm});
  v.push_back({"matmul_broadcast_a", {In{{4, 5}}, In{{3, 5, 6}}}, mm});
  v.push_back({"matmul_broadcast_b", {In{{3, 4, 5}}, In{{5, 6}}}, mm});
  v.push_back({"matmul_broadcast_4d", {In{{2, 1, 4, 5}}, In{{3, 5, 2}}}, mm});
  v.push_back({"matmul_transposed_b", {In{{2, 9, 8}}, tr({2, 8, 9})}, mm});
  v.push_back({"matmul_transposed_a", {tr({2, 9, 8}), In{{2, 8, 9}}}, mm});
  v.push_back({"matmul_strided", {st({6, 8}), In{{8, 5}}}, mm});
  v.push_back({"matmul_attention", {In{{2, 3, 17, 16}}, tr({2, 3, 16, 17})}, mm, 2.0});
  v.push_back({"matmul_mlp", {In{{2, 65, 48}}, In{{48, 96}}}, mm, 2.0});
  // The paths of the small-matrix kernel (backends/cpu/small_gemm.h): ViT's 65 rows (blocks of 5)
  // with one tail column (dot products along K), tail columns with A transposed (broadcasts over
  // rows), 5 tail columns (masked vectors), K not a multiple of 16 in the transposed packing.
  v.push_back({"matmul_vit_qk", {In{{2, 3, 65, 32}}, tr({2, 3, 32, 65})}, mm, 2.0});
  v.push_back({"matmul_vit_av", {In{{2, 3, 65, 65}}, In{{2, 3, 65, 32}}}, mm, 2.0});
  v.push_back({"matmul_tail_cols_a_transposed", {tr({3, 19, 7}), In{{3, 7, 34}}}, mm});
  v.push_back({"matmul_masked_tail_cols", {In{{3, 6, 21}}, tr({3, 21, 37})}, mm});
  v.push_back({"matmul_transposed_b_k_tail", {In{{4, 11, 20}}, tr({4, 20, 35})}, mm});
  auto lin = one([](const std::vector<Tensor>& x) { return linear(x[0], x[1], x.size() > 2 ? x[2] : Tensor()); });
  v.push_back({"linear_bias", {In{{9, 17}}, In{{13, 17}}, In{{13}}}, lin});
  v.push_back({"linear_nobias", {In{{9, 17}}, In{{13, 17}}}, lin});
  v.push_back({"linear_3d", {In{{2, 5, 17}}, In{{13, 17}}, In{{13}}}, lin});
  v.push_back({"linear_batch1", {In{{1, 4}}, In{{3, 4}}, In{{3}}}, lin});
  v.push_back({"linear_transposed_x", {tr({5, 17}), In{{13, 17}}, In{{13}}}, lin});
  v.push_back({"linear_vit_mlp", {In{{2, 65, 64}}, In{{256, 64}}, In{{256}}}, lin, 2.0});
  return v;
}

struct ConvSpec {
  const char* name;
  int64_t N, C, H, W, O, K;
  Conv2dParams p;
  bool bias;
};

std::vector<Case> conv_cases() {
  std::vector<Case> v;
  auto P = [](int64_t s, int64_t pad, int64_t d, int64_t g) {
    Conv2dParams p;
    p.stride_h = p.stride_w = s;
    p.pad_h = p.pad_w = pad;
    p.dilation_h = p.dilation_w = d;
    p.groups = g;
    return p;
  };
  const ConvSpec specs[] = {
      {"3x3_same", 2, 3, 9, 9, 8, 3, P(1, 1, 1, 1), true},
      {"1x1", 1, 4, 8, 7, 6, 1, P(1, 0, 1, 1), false},
      {"1x1_stride2", 2, 8, 9, 9, 16, 1, P(2, 0, 1, 1), false},
      {"7x7_stem", 2, 3, 15, 14, 8, 7, P(2, 3, 1, 1), false},
      {"3x3_stride2_odd", 2, 4, 7, 7, 6, 3, P(2, 0, 1, 1), true},
      {"3x3_stride2_pad", 1, 5, 10, 11, 7, 3, P(2, 1, 1, 1), false},
      {"depthwise", 2, 8, 9, 9, 8, 3, P(1, 1, 1, 8), false},
      {"depthwise_stride2", 2, 16, 10, 10, 16, 3, P(2, 1, 1, 16), true},
      // MobileNet's last stages at 32x32 inputs: maps smaller than the kernel.
      {"depthwise_1x1_spatial", 3, 24, 1, 1, 24, 3, P(1, 1, 1, 24), true},
      {"depthwise_2x2_stride2", 2, 20, 2, 2, 20, 3, P(2, 1, 1, 20), false},
      {"depthwise_dilation2_5x5", 2, 17, 9, 8, 17, 5, P(1, 4, 2, 17), true},
      {"groups2_dilation2", 2, 8, 10, 10, 4, 3, P(1, 2, 2, 2), false},
      {"dilation2", 1, 3, 11, 9, 5, 3, P(1, 0, 2, 1), true},
      {"batch1_5x5", 1, 6, 8, 8, 4, 5, P(1, 2, 1, 1), true},
      {"1x1_spatial", 3, 5, 1, 1, 7, 1, P(1, 0, 1, 1), true},
      {"resnet_block", 4, 16, 8, 8, 16, 3, P(1, 1, 1, 1), false},
      // Outputs of at most 16 pixels: the cpu backend's forward runs these in oneDNN's blocked
      // layout (reorders around the primitive), the backward passes in NHWC.
      {"3x3_4x4_out", 3, 24, 4, 4, 20, 3, P(1, 1, 1, 1), true},
      {"3x3_stride2_to_2x2", 2, 16, 4, 3, 12, 3, P(2, 1, 1, 1), false},
      {"3x3_on_1x1_spatial", 2, 16, 1, 1, 8, 3, P(1, 1, 1, 1), false},
      // ResNet-like channel counts on an odd map: the cpu backend's Winograd path.
      {"3x3_32ch_odd_map", 2, 32, 9, 7, 48, 3, P(1, 1, 1, 1), true},
  };
  for (const ConvSpec& s : specs) {
    const Conv2dParams p = s.p;
    auto f = one([p](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], x.size() > 2 ? x[2] : Tensor(), p); });
    std::vector<In> ins{In{{s.N, s.C, s.H, s.W}}, In{{s.O, s.C / s.p.groups, s.K, s.K}}};
    if (s.bias) ins.push_back(In{{s.O}});
    const double tol = s.C * s.K * s.K / s.p.groups > 64 ? 3.0 : 1.0;
    v.push_back({std::string("conv_") + s.name, ins, f, tol});
    ins[0].layout = Layout::channels_last;
    v.push_back({std::string("conv_") + s.name + "_nhwc", ins, f, tol});
    ins[1].layout = Layout::channels_last;
    v.push_back({std::string("conv_") + s.name + "_nhwc_weights", ins, f, tol});
  }
  // conv + bias + ReLU fused (a oneDNN post-op; Winograd, direct and duet's depthwise kernels).
  for (const ConvSpec& s : specs) {
    if (s.name != std::string("3x3_same") && s.name != std::string("3x3_32ch_odd_map") &&
        s.name != std::string("depthwise_stride2") && s.name != std::string("1x1"))
      continue;
    Conv2dParams p = s.p;
    p.relu = true;
    auto f = one([p](const std::vector<Tensor>& x) { return conv2d(x[0], x[1], x.size() > 2 ? x[2] : Tensor(), p); });
    std::vector<In> ins{cl({s.N, s.C, s.H, s.W}), In{{s.O, s.C / s.p.groups, s.K, s.K}}};
    if (s.bias) ins.push_back(In{{s.O}});
    v.push_back({std::string("conv_relu_") + s.name + "_nhwc", ins, f, s.C * s.K * s.K / s.p.groups > 64 ? 3.0 : 1.0});
    ins[0].layout = Layout::plain;
    v.push_back({std::string("conv_relu_") + s.name, ins, f, s.C * s.K * s.K / s.p.groups > 64 ? 3.0 : 1.0});
  }
  // Frozen weight: only dx (and a bias-only gradient through the sum path).
  {
    In x{{2, 4, 6, 6}}, w{{5, 4, 3, 3}, Layout::plain, false}, b{{5}};
    v.push_back({"conv_frozen_weight", {x, w, b},
                 one([](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], t[2], Conv2dParams{1, 1, 1, 1}); })});
    In xi{{2, 4, 6, 6}, Layout::plain, false};
    v.push_back({"conv_input_no_grad", {xi, In{{5, 4, 3, 3}}},
                 one([](const std::vector<Tensor>& t) { return conv2d(t[0], t[1], Tensor(), Conv2dParams{}); })});
  }
  return v;
}

std::vector<Case> norm_cases() {
  std::vector<Case> v;
  for (bool training : {true, false}) {
    // Layouts: NCHW, NHWC, [N, C], and NHWC maps of 1x1 (whose strides of size-1 dims differ from
    // a contiguous tensor's although the memory order is the same: MobileNet's last stage at 32 px).
    for (int layout = 0; layout < 4; ++layout) {
      BatchNormParams p;
      p.training = training;
      Shape xs = layout == 2 ? Shape{12, 5} : layout == 3 ? Shape{6, 1, 1, 5} : Shape{3, 5, 4, 7};
      In x{xs, layout == 1 ? Layout::channels_last : Layout::plain, true, -2, 3};
      In rm{{5}, Layout::plain, false, -0.5, 0.5}, rv{{5}, Layout::plain, false, 0.5, 1.5};
      const std::string n = std::string("batch_norm_") + (training ? "train" : "eval") +
                            (layout == 0 ? "_nchw" : layout == 1 ? "_nhwc" : layout == 2 ? "_2d" : "_nhwc_1x1");
      const bool nhwc_1x1 = layout == 3;
      v.push_back({n, {x, In{{5}}, In{{5}}, rm, rv}, [p, nhwc_1x1](const std::vector<Tensor>& t) {
                     // The running statistics are outputs too: training updates them in place.
                     Tensor rmean = t[3].clone(), rvar = t[4].clone();
                     // [6, 1, 1, 5] permuted: strides [5, 1, 5, 5], as a channels-last conv writes it.
                     const Tensor x = nhwc_1x1 ? t[0].permute({0, 3, 1, 2}) : t[0];
                     Tensor y = batch_norm(x, t[1], t[2], rmean, rvar, p);
                     return std::vector<Tensor>{y, rmean, rvar};
                   }});
    }
  }
  {
    BatchNormParams p;
    v.push_back({"batch_norm_no_running_stats", {In{{2, 3, 5, 5}}, In{{3}}, In{{3}}},
                 one([p](const std::vector<Tensor>& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), p); })});
    v.push_back({"batch_norm_big_nhwc", {cl({16, 32, 9, 9}), In{{32}}, In{{32}}},
                 one([p](const std::vector<Tensor>& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), p); }),
                 3.0});
  }
  // batch norm + ReLU fused (oneDNN's fuse_norm_relu on NHWC, duet's loop on NCHW), train and eval.
  for (bool training : {true, false}) {
    for (int layout = 0; layout < 3; ++layout) {
      BatchNormParams p;
      p.training = training;
      p.relu = true;
      const Shape xs = layout == 2 ? Shape{12, 5} : Shape{3, 5, 4, 7};
      In x{xs, layout == 1 ? Layout::channels_last : Layout::plain, true, -2, 3};
      In rm{{5}, Layout::plain, false, -0.5, 0.5}, rv{{5}, Layout::plain, false, 0.5, 1.5};
      const std::string n = std::string("batch_norm_relu_") + (training ? "train" : "eval") +
                            (layout == 0 ? "_nchw" : layout == 1 ? "_nhwc" : "_2d");
      v.push_back({n, {x, In{{5}}, In{{5}}, rm, rv}, [p](const std::vector<Tensor>& t) {
                     Tensor rmean = t[3].clone(), rvar = t[4].clone();
                     Tensor y = batch_norm(t[0], t[1], t[2], rmean, rvar, p);
                     return std::vector<Tensor>{y, rmean, rvar};
                   }});
    }
  }
  auto ln = one([](const std::vector<Tensor>& t) {
    return layer_norm(t[0], t.size() > 1 ? t[1] : Tensor(), t.size() > 2 ? t[2] : Tensor(), 1e-5);
  });
  v.push_back({"layer_norm_affine", {In{{6, 10}, Layout::plain, true, -2, 3}, In{{10}}, In{{10}}}, ln});
  v.push_back({"layer_norm_3d", {In{{2, 7, 24}}, In{{24}}, In{{24}}}, ln});
  v.push_back({"layer_norm_plain", {In{{5, 9}}}, ln});
  v.push_back({"layer_norm_gamma_only", {In{{5, 9}}, In{{9}}}, ln});
  v.push_back({"layer_norm_transposed", {tr({8, 12}), In{{12}}, In{{12}}}, ln});
  v.push_back({"layer_norm_vit", {In{{4, 65, 192}}, In{{192}}, In{{192}}}, ln, 2.0});
  v.push_back({"layer_norm_frozen_affine",
               {In{{6, 10}}, In{{10}, Layout::plain, false}, In{{10}, Layout::plain, false}}, ln});
  return v;
}

std::vector<Case> pool_cases() {
  std::vector<Case> v;
  auto P = [](int64_t k, int64_t s, int64_t pad, bool ceil, bool incl) {
    Pool2dParams p;
    p.kernel_h = p.kernel_w = k;
    p.stride_h = p.stride_w = s;
    p.pad_h = p.pad_w = pad;
    p.ceil_mode = ceil;
    p.count_include_pad = incl;
    return p;
  };
  const std::pair<const char*, Pool2dParams> specs[] = {
      {"2x2s2", P(2, 2, 0, false, true)},   {"3x3s2p1", P(3, 2, 1, false, true)}, {"3x3s1p1", P(3, 1, 1, false, true)},
      {"3x3s1p1_excl", P(3, 1, 1, false, false)}, {"3x3s2_ceil", P(3, 2, 0, true, true)},
      {"2x2s2_ceil_excl", P(2, 2, 0, true, false)}, {"3x3s2p1_ceil", P(3, 2, 1, true, true)},
  };
  for (auto& [name, p] : specs) {
    for (int kind = 0; kind < 2; ++kind) {
      const Pool2dParams pp = p;
      auto f = kind == 0 ? one([pp](const std::vector<Tensor>& t) { return max_pool2d(t[0], pp); })
                         : one([pp](const std::vector<Tensor>& t) { return avg_pool2d(t[0], pp); });
      const std::string n = std::string(kind == 0 ? "max_pool_" : "avg_pool_") + name;
      v.push_back({n, {In{{2, 3, 9, 8}}}, f});
      v.push_back({n + "_nhwc", {cl({2, 5, 7, 7})}, f});
    }
  }
  {
    const Pool2dParams p = P(3, 2, 1, false, true);
    v.push_back({"max_pool_big_nhwc", {cl({8, 32, 16, 16})},
                 one([p](const std::vector<Tensor>& t) { return max_pool2d(t[0], p); })});
  }
  auto ad = [](int64_t oh, int64_t ow) {
    return one([oh, ow](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0], oh, ow); });
  };
  v.push_back({"adaptive_global", {In{{3, 5, 6, 7}}}, ad(1, 1)});
  v.push_back({"adaptive_global_nhwc", {cl({3, 5, 6, 7})}, ad(1, 1)});
  v.push_back({"adaptive_global_big_nhwc", {cl({16, 64, 8, 8})}, ad(1, 1)});
  v.push_back({"adaptive_3x2", {In{{2, 3, 7, 5}}}, ad(3, 2)});
  v.push_back({"adaptive_3x2_nhwc", {cl({2, 3, 7, 5})}, ad(3, 2)});
  v.push_back({"adaptive_upsample", {In{{1, 2, 2, 3}}}, ad(4, 5)});
  return v;
}

std::vector<Case> softmax_loss_cases() {
  std::vector<Case> v;
  for (bool lg : {false, true}) {
    for (int64_t d : {-1, 0, 1}) {
      auto f = one([lg, d](const std::vector<Tensor>& t) { return lg ? log_softmax(t[0], d) : softmax(t[0], d); });
      const std::string n = std::string(lg ? "log_softmax" : "softmax") + "_d" + std::to_string(d + 1);
      v.push_back({n, {wide({3, 4, 5}, -3, 3)}, f});
    }
    auto f = one([lg](const std::vector<Tensor>& t) { return lg ? log_softmax(t[0], -1) : softmax(t[0], -1); });
    v.push_back({std::string(lg ? "log_softmax" : "softmax") + "_attention", {wide({2, 3, 65, 65}, -4, 4)}, f});
    v.push_back({std::string(lg ? "log_softmax" : "softmax") + "_transposed", {tr({6, 7})}, f});
  }
  for (double ls : {0.0, 0.1}) {
    auto f = one([ls](const std::vector<Tensor>& t) { return cross_entropy(t[0], t[1], ls); });
    const std::string n = ls == 0.0 ? "cross_entropy" : "cross_entropy_smooth";
    In labels{{16}};
    labels.classes = 10;
    v.push_back({n, {wide({16, 10}, -3, 3), labels}, f});
    In labels1{{1}};
    labels1.classes = 3;
    v.push_back({n + "_batch1", {wide({1, 3}, -3, 3), labels1}, f});
    In labels_big{{256}};
    labels_big.classes = 1000;
    v.push_back({n + "_big", {wide({256, 1000}, -3, 3), labels_big}, f});
  }
  for (double p : {0.1, 0.5}) {
    v.push_back({"dropout_p" + std::to_string(int(p * 10)), {In{{33, 65}}}, one([p](const std::vector<Tensor>& t) {
                   Generator g(4242);
                   return dropout(t[0], p, true, &g);
                 })});
  }
  v.push_back({"dropout_nhwc", {cl({2, 3, 4, 5})}, one([](const std::vector<Tensor>& t) {
                 Generator g(7);
                 return dropout(t[0], 0.3, true, &g);
               })});
  return v;
}

std::vector<Case> memory_cases() {
  std::vector<Case> v;
  auto catf = [](int64_t d) { return one([d](const std::vector<Tensor>& t) { return cat(t, d); }); };
  v.push_back({"cat_d0", {In{{2, 3}}, In{{4, 3}}}, catf(0)});
  v.push_back({"cat_d1", {In{{2, 3}}, In{{2, 5}}, In{{2, 1}}}, catf(1)});
  v.push_back({"cat_channels_nhwc", {cl({2, 3, 4, 5}), cl({2, 6, 4, 5})}, catf(1)});
  v.push_back({"cat_channels_big_nhwc", {cl({8, 32, 8, 8}), cl({8, 16, 8, 8})}, catf(1)});
  v.push_back({"cat_transposed", {tr({4, 5}), In{{4, 2}}}, catf(1)});
  v.push_back({"contiguous_of_transposed", {tr({33, 47})}, one([](const std::vector<Tensor>& t) { return t[0].contiguous(); })});
  v.push_back({"to_channels_last_big", {In{{8, 24, 17, 19}}},
               one([](const std::vector<Tensor>& t) { return t[0].contiguous(MemoryFormat::channels_last); })});
  v.push_back({"to_nchw_big", {cl({8, 24, 17, 19})}, one([](const std::vector<Tensor>& t) { return t[0].contiguous(); })});
  v.push_back({"cast_f64_roundtrip", {In{{5, 6}}}, one([](const std::vector<Tensor>& t) { return t[0].to(DType::f64).to(DType::f32); }),
               1.0, false});
  v.push_back({"cast_bf16", {In{{5, 6}, Layout::plain, false, -100, 100}},
               one([](const std::vector<Tensor>& t) { return t[0].to(DType::bf16).to(DType::f32); })});
  v.push_back({"cast_f16", {In{{5, 6}, Layout::plain, false, -100, 100}},
               one([](const std::vector<Tensor>& t) { return t[0].to(DType::f16).to(DType::f32); })});
  v.push_back({"cast_u8_i64", {In{{5, 6}, Layout::plain, false, 0, 255}}, [](const std::vector<Tensor>& t) {
                 return std::vector<Tensor>{t[0].to(DType::u8).to(DType::f32), t[0].to(DType::i64)};
               }});
  v.push_back({"fill_and_full", {}, [](const std::vector<Tensor>&) {
                 Tensor a = Tensor::full({7, 300, 20}, 2.5);
                 Tensor b = Tensor::zeros({3, 4}).transpose(0, 1);
                 b.fill_(-1.25);
                 return std::vector<Tensor>{a, b.contiguous()};
               }});
  v.push_back({"rand_randn", {}, [](const std::vector<Tensor>&) {
                 Generator g(123);
                 Tensor u = Tensor::rand({70001}, {}, &g);
                 Tensor n = Tensor::randn({301, 7}, {}, &g);
                 return std::vector<Tensor>{u, n};
               }});
  return v;
}

std::vector<Case> optimizer_cases() {
  std::vector<Case> v;
  auto sgd = [](SgdParams p) {
    return [p](const std::vector<Tensor>& t) {
      Tensor w = t[0].detach().clone(), g = t[1].detach(), buf = Tensor::zeros(w.shape());
      sgd_step_(w, g, p.momentum != 0.0 ? buf : Tensor(), p, true);
      sgd_step_(w, g, p.momentum != 0.0 ? buf : Tensor(), p, false);
      return std::vector<Tensor>{w, buf};
    };
  };
  SgdParams plain;
  plain.lr = 0.1;
  SgdParams mom;
  mom.lr = 0.05, mom.momentum = 0.9, mom.weight_decay = 5e-4, mom.dampening = 0.1;
  SgdParams nest = mom;
  nest.nesterov = true, nest.dampening = 0;
  // The optimizer steps must match the reference to 1e-6 relative (tol 0.01), on sizes that reach
  // the vector body, its remainder and the OpenMP split. Not bit for bit: built for the native ISA
  // (DUET_NATIVE), the compiler fuses a*b+c into FMAs in one backend's loop and not the other's.
  v.push_back({"sgd_plain", {In{{1000, 37}, Layout::plain, false}, In{{1000, 37}, Layout::plain, false}}, sgd(plain), 0.01});
  v.push_back({"sgd_momentum", {In{{1000, 37}, Layout::plain, false}, In{{1000, 37}, Layout::plain, false}}, sgd(mom), 0.01});
  v.push_back({"sgd_nesterov", {In{{13}, Layout::plain, false}, In{{13}, Layout::plain, false}}, sgd(nest), 0.01});
  v.push_back({"sgd_nesterov_large", {In{{70001}, Layout::plain, false}, In{{70001}, Layout::plain, false}}, sgd(nest), 0.01});
  auto adam = [](AdamParams p) {
    return [p](const std::vector<Tensor>& t) {
      Tensor w = t[0].detach().clone(), g = t[1].detach(), m = Tensor::zeros(w.shape()), s = Tensor::zeros(w.shape());
      AdamParams q = p;
      for (int64_t step = 1; step <= 3; ++step) {
        q.step = step;
        adam_step_(w, g, m, s, q);
      }
      return std::vector<Tensor>{w, m, s};
    };
  };
  AdamParams a;
  a.weight_decay = 0.01;
  AdamParams aw = a;
  aw.decoupled = true;
  v.push_back({"adam", {In{{999, 41}, Layout::plain, false}, In{{999, 41}, Layout::plain, false}}, adam(a), 0.01});
  v.push_back({"adamw", {In{{7, 3}, Layout::plain, false}, In{{7, 3}, Layout::plain, false}}, adam(aw), 0.01});
  v.push_back({"adamw_large", {In{{257, 301}, Layout::plain, false}, In{{257, 301}, Layout::plain, false}}, adam(aw), 0.01});
  return v;
}

std::vector<Case> composite_cases() {
  std::vector<Case> v;
  // A small conv net end to end in channels-last, and an attention block, to catch layout
  // mismatches between ops that each pass alone.
  v.push_back({"small_convnet_nhwc",
               {cl({4, 3, 12, 12}), In{{8, 3, 3, 3}}, In{{8}}, In{{8}}, In{{8, 1, 3, 3}}, In{{10, 8}}, In{{10}}},
               one([](const std::vector<Tensor>& t) {
                 BatchNormParams bp;
                 Tensor h = conv2d(t[0], t[1], Tensor(), Conv2dParams{1, 1, 1, 1});
                 h = relu(batch_norm(h, t[2], t[3], Tensor(), Tensor(), bp));
                 Conv2dParams dw{2, 2, 1, 1};
                 dw.groups = 8;
                 h = relu6(conv2d(h, t[4], Tensor(), dw));
                 h = max_pool2d(h, Pool2dParams{});
                 h = adaptive_avg_pool2d(h, 1, 1).flatten(1);
                 return linear(h, t[5], t[6]);
               }),
               2.0});
  // DenseNet's tail on 32x32 inputs: NHWC maps pooled to [N, C, 1, 1], whose gradient comes back
  // from a 1x1 convolution with NCHW strides ([N, C, 1, 1] is both layouts). oneDNN matched the
  // two layouts by their strides and ran its reference pooling kernel until md_of() gave size-1
  // dims canonical strides; this pins the values of that path.
  v.push_back({"densenet_tail_pool_to_1x1_nhwc", {cl({3, 16, 2, 2}), In{{16}}, In{{16}}, In{{8, 16, 1, 1}}},
               one([](const std::vector<Tensor>& t) {
                 BatchNormParams bp;
                 Tensor h = avg_pool2d(t[0], Pool2dParams{});
                 h = relu(batch_norm(h, t[1], t[2], Tensor(), Tensor(), bp));
                 h = conv2d(h, t[3], Tensor(), Conv2dParams{});
                 return adaptive_avg_pool2d(h, 1, 1).flatten(1);
               }),
               2.0});
  v.push_back({"attention_block", {In{{2, 9, 16}}, In{{48, 16}}, In{{48}}, In{{16}}, In{{16}}},
               one([](const std::vector<Tensor>& t) {
                 Tensor h = layer_norm(t[0], t[3], t[4]);
                 Tensor qkv = linear(h, t[1], t[2]).reshape({2, 9, 3, 2, 8}).permute({2, 0, 3, 1, 4});
                 Tensor q = qkv.select(0, 0), k = qkv.select(0, 1), vv = qkv.select(0, 2);
                 Tensor att = softmax(mul(matmul(q, k.transpose(-1, -2)), 1.0 / std::sqrt(8.0)), -1);
                 return gelu(matmul(att, vv).permute({0, 2, 1, 3}).reshape({2, 9, 16}));
               }),
               2.0});
  return v;
}

// ---- mode 2: the table's gradients against finite differences ------------------------------------

// L = sum_i <out_i, R_i> over the case's differentiable outputs, for leaves `leaves` (f64, reference
// backend). The first call (backward = true) picks those outputs (the ones gradients flow from: a
// batch norm's updated running statistics are outputs without one) and makes their fixed random
// R_i; later calls evaluate L at other leaves with the same terms.
double weighted_sum(const Case& c, const std::vector<Tensor>& leaves, std::vector<Tensor>& R, bool backward) {
  std::vector<Tensor> views;
  for (size_t i = 0; i < c.ins.size(); ++i) views.push_back(view_of(c.ins[i], leaves[i]));
  const std::vector<Tensor> outs = c.f(views);
  if (backward) {
    R.assign(outs.size(), Tensor());
    for (size_t i = 0; i < outs.size(); ++i)
      if (is_floating(outs[i].dtype()) && outs[i].requires_grad()) R[i] = random_tensor(outs[i].shape(), 77 + i, DType::f64);
  }
  Tensor loss;
  for (size_t i = 0; i < outs.size(); ++i) {
    if (!R[i].defined()) continue;
    const Tensor term = sum(mul(outs[i], R[i]));
    loss = loss.defined() ? add(loss, term) : term;
  }
  if (!loss.defined()) return 0.0;
  if (backward) loss.backward();
  return loss.item();
}

class Gradients : public ::testing::TestWithParam<Case> {};

// The directional derivative of L along random directions V (one per differentiable leaf), from
// the analytic gradients (sum_j <grad_j, V_j>), against (L(x + eps V) - L(x - eps V)) / (2 eps).
// Two directions per case, so every element's gradient takes part: one forward and backward pass
// and four forward passes, whatever the case's size.
TEST_P(Gradients, MatchFiniteDifferencesInF64) {
  const Case& c = GetParam();
  BackendGuard guard(DeviceType::cpu, Backend::reference);
  std::vector<Tensor> leaves;
  for (size_t i = 0; i < c.ins.size(); ++i) leaves.push_back(make_leaf(c.ins[i], 1000 + 17 * i, DType::f64));
  std::vector<Tensor> R;
  weighted_sum(c, leaves, R, true);
  std::vector<size_t> with_grad;
  for (size_t i = 0; i < leaves.size(); ++i)
    if (leaves[i].requires_grad() && leaves[i].grad().defined()) with_grad.push_back(i);
  ASSERT_FALSE(with_grad.empty()) << "no gradient reached an input: the case belongs to the conformance mode only";
  // eps balances the rounding of L's long sums (divided by 2 eps) against the curvature; the
  // tolerance is relative to the size of the terms summed, |grad_j| |V_j|, not to their sum, which
  // cancels.
  const double eps = 1e-6;
  for (uint64_t d = 0; d < 2; ++d) {
    NoGradGuard no_grad;
    double analytic = 0, scale = 0;
    std::vector<Tensor> plus, minus;
    for (size_t i = 0; i < leaves.size(); ++i) {
      plus.push_back(leaves[i].detach());
      minus.push_back(leaves[i].detach());
    }
    for (size_t i : with_grad) {
      const Tensor V = random_tensor(leaves[i].shape(), 500 + 31 * d + i, DType::f64);
      analytic += sum(mul(leaves[i].grad(), V)).item();
      scale += sum(abs(mul(leaves[i].grad(), V))).item();
      // leaf +- eps V keeps the leaf's layout (channels-last, the strided or transposed storage),
      // so the case's view of it is the same view.
      plus[i] = add(leaves[i].detach(), mul(V, eps));
      minus[i] = sub(leaves[i].detach(), mul(V, eps));
    }
    const double numeric = (weighted_sum(c, plus, R, false) - weighted_sum(c, minus, R, false)) / (2 * eps);
    EXPECT_NEAR(analytic, numeric, 1e-7 * scale + 1e-9) << "direction " << d << ", terms summing to " << scale;
  }
}

// Cases with a gradient: at least one input that requires one and a floating-point output.
std::vector<Case> differentiable_cases();

std::vector<Case> all_cases() {
  std::vector<Case> all;
  for (auto gen : {elementwise_cases, reduction_cases, linalg_cases, conv_cases, norm_cases, pool_cases,
                   softmax_loss_cases, memory_cases, optimizer_cases, composite_cases})
    for (Case& c : gen()) all.push_back(std::move(c));
  return all;
}

INSTANTIATE_TEST_SUITE_P(Ops, Conformance, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

std::vector<Case> differentiable_cases() {
  std::vector<Case> v;
  for (Case& c : all_cases()) {
    bool grad = false;
    for (const In& in : c.ins) grad = grad || (in.grad && in.classes == 0);
    if (grad && c.gradient_check) v.push_back(std::move(c));
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ops, Gradients, ::testing::ValuesIn(differentiable_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// ---- backend properties --------------------------------------------------------------------------------

TEST(CpuBackend, F64OnOneDnnOpsNamesTheOp) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({1, 2, 5, 5}, 1), w = random_tensor({3, 2, 3, 3}, 2);
  const Tensor a = random_tensor({4, 5}, 3), b = random_tensor({5, 2}, 4);
  auto expect_error = [](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << " on f64 did not throw";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(op), std::string::npos) << msg;
      EXPECT_NE(msg.find("f64"), std::string::npos) << msg;
      EXPECT_NE(msg.find("reference"), std::string::npos) << msg;
    }
  };
  expect_error([&] { conv2d(x, w); }, "conv2d");
  expect_error([&] { matmul(a, b); }, "matmul");
  expect_error([&] { softmax(a, -1); }, "softmax");
  expect_error([&] { layer_norm(a, Tensor(), Tensor()); }, "layer_norm");
  expect_error([&] { max_pool2d(x, Pool2dParams{}); }, "max_pool2d");
  // The loop ops do run in f64.
  EXPECT_TRUE(all_close(add(a, a), mul(a, 2.0), 0, 0));
}

// argmax's NaN rule (the first NaN wins) and first-of-ties in every walk of the cpu kernel:
// lines along a contiguous dim and runs of outputs scanned together.
TEST(CpuBackend, ArgmaxNaNAndTiesMatchReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  const Shape shape{3, 5, 4, 6};
  std::vector<float> v(static_cast<size_t>(numel_of(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 7) % 5);  // many ties
  for (size_t i = 3; i < v.size(); i += 17) v[i] = NAN;
  for (const MemoryFormat mf : {MemoryFormat::contiguous, MemoryFormat::channels_last}) {
    const Tensor x = Tensor::from_vector<float>(v, shape).contiguous(mf);
    for (int64_t d = 0; d < 4; ++d) {
      Tensor got, want;
      {
        BackendGuard g(DeviceType::cpu, Backend::cpu);
        got = argmax(x, d);
      }
      {
        BackendGuard g(DeviceType::cpu, Backend::reference);
        want = argmax(x, d);
      }
      EXPECT_EQ(got.to_vector<int64_t>(), want.to_vector<int64_t>()) << "dim " << d << " channels_last " << (mf == MemoryFormat::channels_last);
    }
  }
}

// NaN and infinities through the SIMD elementwise loops (long enough for the vector body):
// NaN propagates through relu, clamp, maximum/minimum and the smooth activations as in
// PyTorch; the loop ops match the reference bit for bit, the transcendental ones closely.
TEST(CpuBackend, ElementwiseNaNMatchesReference) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  const float special[] = {NAN, -1.0f, 2.0f, -INFINITY, INFINITY, 0.0f, -0.0f, 0.25f, 7.0f};
  std::vector<float> v(70001);
  for (size_t i = 0; i < v.size(); ++i) v[i] = special[(i * 5) % 9];
  const Tensor x = Tensor::from_vector<float>(v, {static_cast<int64_t>(v.size())});
  struct Op {
    const char* name;
    std::function<Tensor(const Tensor&)> f;
    bool exact;
  };
  const std::vector<Op> ops = {
      {"relu", [](const Tensor& t) { return relu(t); }, true},
      {"relu6", [](const Tensor& t) { return relu6(t); }, true},
      {"clamp_min", [](const Tensor& t) { return clamp_min(t, 0.5); }, true},
      {"clamp_max", [](const Tensor& t) { return clamp_max(t, 0.5); }, true},
      {"maximum", [](const Tensor& t) { return maximum(t, mul(t, -1.0)); }, true},
      {"minimum", [](const Tensor& t) { return minimum(mul(t, -1.0), t); }, true},
      {"abs", [](const Tensor& t) { return abs(t); }, true},
      {"neg_mul", [](const Tensor& t) { return neg(mul(t, 0.5)); }, true},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }, false},
      {"silu", [](const Tensor& t) { return silu(t); }, false},
      {"hardswish", [](const Tensor& t) { return hardswish(t); }, false},
      {"gelu", [](const Tensor& t) { return gelu(t); }, false},
  };
  for (const Op& op : ops) {
    std::vector<float> got, want;
    {
      BackendGuard g(DeviceType::cpu, Backend::cpu);
      got = op.f(x).to_vector<float>();
    }
    {
      BackendGuard g(DeviceType::cpu, Backend::reference);
      want = op.f(x).to_vector<float>();
    }
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = std::memcmp(&got[i], &want[i], sizeof(float)) == 0 || (std::isnan(got[i]) && std::isnan(want[i]));
      const bool close = same || (!std::isnan(got[i]) && !std::isnan(want[i]) && std::isinf(got[i]) == std::isinf(want[i]) &&
                                  std::abs(got[i] - want[i]) <= 1e-6 + 1e-6 * std::abs(want[i]));
      ASSERT_TRUE(op.exact ? same : close) << op.name << " at " << i << ": " << got[i] << " vs " << want[i] << " (x = " << v[i] << ")";
    }
  }
}

// GELU (erf) in f32 against the reference in f64 on a dense grid: the cpu kernel keeps relative
// accuracy into the negative tail (where 0.5 x (1 + erf(x / sqrt2)) in f32 has a relative error
// of 5% at x = -5), and its derivative is accurate in absolute terms.
TEST(CpuBackend, GeluErfF32IsAccurate) {
  if (!backend_available(Backend::cpu)) GTEST_SKIP() << "the cpu backend (oneDNN) is not built into this binary";
  std::vector<float> xs;
  for (int i = 0; i <= 200000; ++i) xs.push_back(-8.0f + 20.0f * static_cast<float>(i) / 200000.0f);
  const std::vector<double> xd(xs.begin(), xs.end());
  const Shape shape{static_cast<int64_t>(xs.size())};
  auto run = [&](Backend b, const Tensor& x) {
    BackendGuard guard(DeviceType::cpu, b);
    Tensor leaf = x.detach();
    leaf.set_requires_grad(true);
    const Tensor y = gelu(leaf);
    sum(y).backward();
    return std::make_pair(y.to_vector<double>(), leaf.grad().to_vector<double>());
  };
  const auto [y, dy] = run(Backend::cpu, Tensor::from_vector<float>(xs, shape));
  const auto [y64, dy64] = run(Backend::reference, Tensor::from_vector<double>(xd, shape, TensorOptions(DType::f64)));
  double max_rel = 0, max_abs_grad = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    // The f64 reference itself cancels in 1 + erf below x = -5 (relative error 1e-10 at -5).
    if (xs[i] >= -5.0f && y64[i] != 0) max_rel = std::max(max_rel, std::abs(y[i] - y64[i]) / std::abs(y64[i]));
    max_abs_grad = std::max(max_abs_grad, std::abs(dy[i] - dy64[i]));
  }
  EXPECT_LT(max_rel, 1e-6);       // measured 3.8e-7 (AVX-512)
  EXPECT_LT(max_abs_grad, 5e-7);  // measured 1.8e-7
}

#ifdef DUET_HAVE_DNNL
// The shapes a model's tail produces ([N, C, 1, 1] maps, gradients that reach them with NCHW
// strides) must still land on oneDNN's optimised kernels: a reference kernel there cost
// DenseNet-121 3% of its step. Every op of this tail reports which implementation ran.
TEST(CpuBackend, ModelTailRunsNoReferenceKernel) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({8, 64, 2, 2}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  Tensor g = Tensor::ones({64}).set_requires_grad(true), b = Tensor::zeros({64}).set_requires_grad(true);
  Tensor w1 = random_tensor({32, 64, 1, 1}, 2, DType::f32).set_requires_grad(true);
  Tensor w3 = random_tensor({16, 32, 3, 3}, 3, DType::f32).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  BatchNormParams bp;
  Tensor h = avg_pool2d(x, Pool2dParams{});
  h = relu(batch_norm(h, g, b, Tensor(), Tensor(), bp));
  h = conv2d(h, w1, Tensor(), Conv2dParams{});
  h = conv2d(h, w3, Tensor(), Conv2dParams{1, 1, 1, 1});  // a 3x3 kernel on a 1x1 map
  sum(adaptive_avg_pool2d(h, 1, 1)).backward();
  profiler::enable(false);
  int with_impl = 0;
  for (const OpEvent& e : profiler::collect()) {
    if (e.impl.empty()) continue;
    ++with_impl;
    EXPECT_EQ(e.impl.find("ref"), std::string::npos) << e.name << " " << e.shapes << " ran " << e.impl;
    EXPECT_EQ(e.impl.find("gemm"), std::string::npos) << e.name << " " << e.shapes << " ran " << e.impl;
  }
  profiler::clear();
  EXPECT_GE(with_impl, 7);  // pool fwd/bwd, bn fwd/bwd, 2 convs x 3 passes
}

// One training step of a small conv net; the second identical step must find every primitive in
// the cache.
TEST(CpuBackend, SecondTrainingStepCreatesNoPrimitive) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  Tensor w1 = random_tensor({8, 3, 3, 3}, 1, DType::f32).set_requires_grad(true);
  Tensor g1 = Tensor::ones({8}).set_requires_grad(true), b1 = Tensor::zeros({8}).set_requires_grad(true);
  Tensor w2 = random_tensor({16, 8, 3, 3}, 2, DType::f32).set_requires_grad(true);
  Tensor fc = random_tensor({10, 16}, 3, DType::f32).set_requires_grad(true);
  Tensor fb = Tensor::zeros({10}).set_requires_grad(true);
  Tensor rm = Tensor::zeros({8}), rv = Tensor::ones({8});
  const Tensor x = random_tensor({4, 3, 16, 16}, 4, DType::f32).contiguous(MemoryFormat::channels_last);
  const Tensor y = Tensor::from_vector<int64_t>({1, 3, 5, 7}, {4}, TensorOptions(DType::i64));
  std::vector<Tensor> params{w1, g1, b1, w2, fc, fb};
  std::vector<Tensor> bufs;
  for (const Tensor& p : params) bufs.push_back(Tensor::zeros(p.shape()));
  auto step = [&](bool first) {
    BatchNormParams bp;
    Tensor h = relu(batch_norm(conv2d(x, w1, Tensor(), Conv2dParams{1, 1, 1, 1}), g1, b1, rm, rv, bp));
    h = max_pool2d(h, Pool2dParams{});
    h = gelu(conv2d(h, w2, Tensor(), Conv2dParams{2, 2, 1, 1}));
    h = adaptive_avg_pool2d(h, 1, 1).flatten(1);
    Tensor loss = cross_entropy(softmax(linear(h, fc, fb), -1), y, 0.1);
    loss.backward();
    SgdParams sp;
    sp.momentum = 0.9;
    for (size_t i = 0; i < params.size(); ++i) {
      sgd_step_(params[i], params[i].grad(), bufs[i], sp, first);
      params[i].zero_grad();
    }
  };
  step(true);
  cpu_primitive_cache_reset_stats();
  step(false);
  const CpuCacheStats s = cpu_primitive_cache_stats();
  EXPECT_EQ(s.misses, 0) << "the second step created primitives";
  EXPECT_GT(s.hits, 5);
}

// Sets one of the cpu backend's kernel policies for a test; the automatic choice comes back after.
struct ScopedPolicy {
  void (*set)(cpu::KernelPolicy);
  ScopedPolicy(void (*s)(cpu::KernelPolicy), cpu::KernelPolicy p) : set(s) { set(p); }
  ~ScopedPolicy() { set(cpu::KernelPolicy::automatic); }
};

// duet's own depthwise kernels (backends/cpu/depthwise.h) on every depthwise case, forced on
// (the automatic policy gives them only the shapes oneDNN has no depthwise kernel for).
TEST(CpuBackend, OwnDepthwiseKernelsMatchReference) {
  ScopedPolicy always(cpu::set_depthwise_policy, cpu::KernelPolicy::always);
  int n = 0;
  for (const Case& c : conv_cases()) {
    if (c.name.find("depthwise") == std::string::npos) continue;
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
    ++n;
  }
  EXPECT_GE(n, 15);
}

// Winograd (backends/cpu/conv_algorithm.h) on every dense 3x3 stride-1 case, forced on, within
// the conformance tolerance; and the automatic policy does pick it for a ResNet-like layer.
TEST(CpuBackend, WinogradConvolutionMatchesReference) {
  ScopedPolicy always(cpu::set_winograd_policy, cpu::KernelPolicy::always);
  int n = 0;
  for (const Case& c : conv_cases()) {
    const bool dense3x3 = c.name.find("3x3_same") != std::string::npos || c.name.find("resnet_block") != std::string::npos ||
                          c.name.find("3x3_4x4_out") != std::string::npos || c.name.find("3x3_32ch") != std::string::npos ||
                          c.name.find("3x3_on_1x1") != std::string::npos;
    if (!dense3x3) continue;
    SCOPED_TRACE(c.name);
    expect_cpu_matches_reference(c);
    ++n;
  }
  EXPECT_GE(n, 15);
}

// Every matmul case on duet's small-matrix kernel (backends/cpu/small_gemm.h), forced on, and on
// oneDNN, forced off: the automatic choice depends on the thread count, so this checks both paths
// whatever it is.
TEST(CpuBackend, SmallGemmAndOneDnnMatmulsMatchReference) {
  if (!cpu::small_gemm_available()) std::printf("[ NOTE ] no AVX-512 here: the small-matrix kernel is not run\n");
  for (cpu::KernelPolicy p : {cpu::KernelPolicy::always, cpu::KernelPolicy::never}) {
    ScopedPolicy policy(cpu::set_small_gemm_policy, p);
    int n = 0;
    for (const Case& c : linalg_cases()) {
      if (c.name.rfind("matmul", 0) != 0) continue;
      SCOPED_TRACE(c.name + (p == cpu::KernelPolicy::always ? " (small gemm)" : " (oneDNN)"));
      expect_cpu_matches_reference(c);
      ++n;
    }
    EXPECT_GE(n, 15);
  }
}

// Attention's products, forward and backward, go to the small-matrix kernel on their own.
TEST(CpuBackend, AutomaticPolicyRunsAttentionOnSmallGemm) {
  if (!cpu::small_gemm_available()) GTEST_SKIP() << "no AVX-512 on this CPU: attention runs on oneDNN";
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor q = random_tensor({8, 3, 65, 64}, 1, DType::f32).set_requires_grad(true);
  const Tensor k = random_tensor({8, 3, 65, 64}, 2, DType::f32).set_requires_grad(true);
  profiler::clear();
  profiler::enable(true);
  sum(matmul(softmax(matmul(q, k.transpose(-1, -2)), -1), k)).backward();
  profiler::enable(false);
  int small = 0;
  std::string all;
  for (const OpEvent& e : profiler::collect()) {
    if (std::string(e.name).rfind("matmul", 0) != 0) continue;
    all += std::string(e.name) + "=" + e.impl + " ";
    small += e.impl == "duet:small_gemm_avx512";
  }
  profiler::clear();
  EXPECT_EQ(small, 6) << all;  // two products, each with two backward products
}

// f16 has no oneDNN CPU kernel: the cpu backend hands conv2d and linear to the reference backend's
// loops, and the profiler's implementation column says so and why (never a silent fallback).
TEST(CpuBackend, F16FallbackToTheReferenceIsNamedInTheImplementationColumn) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({2, 3, 6, 6}, 1, DType::f32).to(DType::f16);
  const Tensor w = random_tensor({4, 3, 3, 3}, 2, DType::f32).to(DType::f16);
  const Tensor a = random_tensor({5, 7}, 3, DType::f32).to(DType::f16);
  const Tensor lw = random_tensor({2, 7}, 4, DType::f32).to(DType::f16);
  profiler::clear();
  profiler::enable(true);
  const Tensor y = conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1});
  const Tensor z = linear(a, lw, Tensor());
  profiler::enable(false);
  int named = 0;
  std::string all;
  for (const OpEvent& e : profiler::collect()) {
    const std::string name = e.name;
    if (name != "conv2d" && name != "linear") continue;
    all += name + "=" + e.impl + " (" + backend_name(e.backend) + ") ";
    named += e.impl == "reference loops: f16 has no oneDNN 2.6 CPU kernel";
  }
  profiler::clear();
  EXPECT_EQ(named, 2) << all;
  // The numbers are the reference backend's own.
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  EXPECT_EQ(y.to(DType::f32).to_vector<float>(), conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1}).to(DType::f32).to_vector<float>());
  EXPECT_EQ(z.to(DType::f32).to_vector<float>(), linear(a, lw, Tensor()).to(DType::f32).to_vector<float>());
}

TEST(CpuBackend, AutomaticPolicyRunsResNetLayersOnWinograd) {
  BackendGuard guard(DeviceType::cpu, Backend::cpu);
  const Tensor x = random_tensor({4, 32, 8, 8}, 1, DType::f32).contiguous(MemoryFormat::channels_last).set_requires_grad(true);
  const Tensor w = random_tensor({32, 32, 3, 3}, 2, DType::f32).set_requires_grad(true);
  auto impls = [&] {
    profiler::clear();
    profiler::enable(true);
    sum(conv2d(x, w, Tensor(), Conv2dParams{1, 1, 1, 1})).backward();
    profiler::enable(false);
    std::string all;
    for (const OpEvent& e : profiler::collect())
      if (!e.impl.empty()) all += std::string(e.name) + "=" + e.impl + " ";
    profiler::clear();
    return all;
  };
  const std::string automatic = impls();
  size_t wino = 0;
  for (size_t at = automatic.find("wino"); at != std::string::npos; at = automatic.find("wino", at + 1)) ++wino;
  EXPECT_EQ(wino, 3u) << automatic;  // forward, backward data, backward weights
  cpu::set_winograd_policy(cpu::KernelPolicy::never);
  const std::string direct = impls();
  cpu::set_winograd_policy(cpu::KernelPolicy::automatic);
  EXPECT_EQ(direct.find("wino"), std::string::npos) << direct;
}

TEST(CpuBackend, ThreadCountIsSettable) {
  const int before = num_threads();
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  {
    BackendGuard guard(DeviceType::cpu, Backend::cpu);
    const Tensor a = random_tensor({64, 70}, 1, DType::f32), b = random_tensor({70, 33}, 2, DType::f32);
    const Tensor c1 = matmul(a, b);
    set_num_threads(before);
    const Tensor c2 = matmul(a, b);
    EXPECT_TRUE(all_close(c1, c2, 1e-5, 1e-5));
  }
  set_num_threads(before);
  EXPECT_THROW(set_num_threads(0), Error);
}

// Reductions split across threads combine their partial sums in thread order: repeated runs
// with the same thread count give the same bits (channels-last bias-gradient pattern, few
// outputs, so the rows are split).
TEST(CpuBackend, ReductionsAreDeterministic) {
  const int before = num_threads();
  set_num_threads(2);
  {
    BackendGuard guard(DeviceType::cpu, Backend::cpu);
    const Tensor x = random_tensor({32, 24, 17, 19}, 5, DType::f32).contiguous(MemoryFormat::channels_last);
    const std::vector<float> first = sum(x, {0, 2, 3}).to_vector<float>();
    const std::vector<float> mean_first = mean(x, {0, 2, 3}).to_vector<float>();
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(sum(x, {0, 2, 3}).to_vector<float>(), first);
      EXPECT_EQ(mean(x, {0, 2, 3}).to_vector<float>(), mean_first);
    }
  }
  set_num_threads(before);
}
#endif

}  // namespace
}  // namespace duet
