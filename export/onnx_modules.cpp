// Each module type's eval-mode forward pass as ONNX nodes (opset 17): the exporter's one table.
// A translation reads the module's configuration and parameters, emits its nodes through the
// builder (export/onnx_graph.h) and calls translate() on its children, in the order and with the
// glue (adds, concatenations, reshapes) its forward() has. The layers of engine/nn come first, then
// the zoo's blocks and networks, family by family. Keep each entry beside what its forward() does:
// a model's forward() and its entry here are the two places that say what it computes, and the
// ONNX Runtime test (tests/onnx_runtime_check.py) holds them to each other.
#include "export/onnx_modules.h"
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>
#include <typeindex>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include "engine/error.h"
#include "engine/nn/layers.h"
#include "models/blocks.h"
#include "models/convnext.h"
#include "models/densenet.h"
#include "models/mlp.h"
#include "models/mobilenet.h"
#include "models/resnet.h"
#include "models/small_cnn.h"
#include "models/vit.h"

namespace duet::exporter {

namespace {

using Translation = std::function<Value(OnnxGraph&, const nn::Module&, const std::string&, const Value&)>;
struct Entry {
  std::string type;  // the module's type_name(), for messages
  Translation fn;
};
using Table = std::map<std::type_index, Entry>;

std::string child_path(const std::string& path, const nn::Module& child) {
  return path.empty() ? child.name() : path + "." + child.name();
}

// The child `c` of the module at `path`, applied to x.
Value call(OnnxGraph& g, const nn::Module& c, const std::string& path, const Value& x) {
  return translate(g, c, child_path(path, c), x);
}

[[noreturn]] void cannot(const std::string& path, const std::string& what) {
  throw Error(fmt::format("ONNX export: module '{}': {}", path.empty() ? "(the model)" : path, what));
}

void expect_rank(const std::string& path, const char* type, const Value& x, std::initializer_list<int64_t> ranks) {
  if (std::find(ranks.begin(), ranks.end(), x.rank()) == ranks.end())
    cannot(path, fmt::format("{} receives a value of shape {}, which its forward pass does not accept", type,
                             tracked_shape_str(x.shape)));
}

// ---- elementwise and shape ops -------------------------------------------------------------------
// numpy broadcasting of two tracked shapes (the batch dimension broadcasts against 1 and itself).
Shape broadcast(const std::string& path, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x == y || y == 1) out[i] = x;
    else if (x == 1) out[i] = y;
    else cannot(path, fmt::format("shapes {} and {} do not broadcast", tracked_shape_str(a), tracked_shape_str(b)));
  }
  return out;
}

Value binary(OnnxGraph& g, const std::string& path, const char* op, const Value& a, const std::string& b_name,
             const Shape& b_shape) {
  return g.node(path, op, {a.name, b_name}, broadcast(path, a.shape, b_shape));
}
Value binary(OnnxGraph& g, const std::string& path, const char* op, const Value& a, const Value& b) {
  return binary(g, path, op, a, b.name, b.shape);
}
Value scalar_op(OnnxGraph& g, const std::string& path, const char* op, const Value& a, float v) {
  return binary(g, path, op, a, g.floats(path + ".const", {v}, {}), {});
}

Value unary(OnnxGraph& g, const std::string& path, const char* op, const Value& x) {
  return g.node(path, op, {x.name}, x.shape);
}

Value transpose(OnnxGraph& g, const std::string& path, const Value& x, const std::vector<int64_t>& perm) {
  Shape s;
  for (int64_t p : perm) s.push_back(x.dim(p));
  return g.node(path, "Transpose", {x.name}, s, [&](onnx::NodeProto& n) { attr(n, "perm", perm); });
}

// x reshaped to `to` (tracked dims; kBatch where the batch goes). The shape constant copies a batch
// dimension that stays in place (0, so shape inference keeps it symbolic) and infers one that moves.
Value reshape(OnnxGraph& g, const std::string& path, const Value& x, const Shape& to) {
  std::vector<int64_t> spec;
  for (size_t i = 0; i < to.size(); ++i) {
    if (to[i] != kBatch) spec.push_back(to[i]);
    else spec.push_back(i < x.shape.size() && x.shape[i] == kBatch ? 0 : -1);
  }
  DUET_CHECK(std::count(spec.begin(), spec.end(), -1) <= 1, "ONNX export: internal: reshape {} to {} infers two dims",
             tracked_shape_str(x.shape), tracked_shape_str(to));
  return g.node(path, "Reshape", {x.name, g.ints(path + ".shape", spec)}, to);
}

// torch's x.flatten(start, end).
Value flatten(OnnxGraph& g, const std::string& path, const Value& x, int64_t start, int64_t end) {
  const int64_t r = x.rank();
  const int64_t s = start < 0 ? start + r : start, e = end < 0 ? end + r : end;
  if (s < 0 || e >= r || s > e) cannot(path, fmt::format("flatten({}, {}) of a {}-d value", start, end, r));
  Shape to(x.shape.begin(), x.shape.begin() + s);
  int64_t merged = 1;
  bool batch = false;
  for (int64_t i = s; i <= e; ++i) {
    if (x.shape[static_cast<size_t>(i)] == kBatch) batch = true;
    else merged *= x.shape[static_cast<size_t>(i)];
  }
  to.push_back(batch ? kBatch : merged);
  to.insert(to.end(), x.shape.begin() + e + 1, x.shape.end());
  if (s == 1 && e == r - 1 && x.shape[0] == kBatch)  // torch.flatten(x, 1): ONNX's Flatten, as PyTorch exports it
    return g.node(path, "Flatten", {x.name}, to, [](onnx::NodeProto& n) { attr(n, "axis", int64_t{1}); });
  return reshape(g, path, x, to);
}

// x[:, index] along `axis` (the axis removed).
Value select(OnnxGraph& g, const std::string& path, const Value& x, int64_t axis, int64_t index) {
  Shape s = x.shape;
  s.erase(s.begin() + axis);
  return g.node(path, "Gather", {x.name, g.ints(path + ".index", {index}, true)}, s,
                [&](onnx::NodeProto& n) { attr(n, "axis", axis); });
}

Value concat(OnnxGraph& g, const std::string& path, const std::vector<Value>& xs, int64_t axis) {
  Shape s = xs.at(0).shape;
  std::vector<std::string> names;
  for (size_t i = 0; i < xs.size(); ++i) {
    names.push_back(xs[i].name);
    if (i > 0) s[static_cast<size_t>(axis)] += xs[i].dim(axis);
  }
  return g.node(path, "Concat", names, s, [&](onnx::NodeProto& n) { attr(n, "axis", axis); });
}

// ---- layers --------------------------------------------------------------------------------------
Value conv2d(OnnxGraph& g, const nn::Conv2d& c, const std::string& path, const Value& x) {
  expect_rank(path, "Conv2d", x, {4});
  if (x.dim(1) != c.in_channels)
    cannot(path, fmt::format("Conv2d({}, {}) receives {} channels (shape {})", c.in_channels, c.out_channels, x.dim(1),
                             tracked_shape_str(x.shape)));
  const Conv2dParams& p = c.params;
  const int64_t kh = c.weight.size(2), kw = c.weight.size(3);
  const auto out = [](int64_t in, int64_t k, int64_t s, int64_t pad, int64_t d) { return (in + 2 * pad - d * (k - 1) - 1) / s + 1; };
  const Shape s{x.dim(0), c.out_channels, out(x.dim(2), kh, p.stride_h, p.pad_h, p.dilation_h),
                out(x.dim(3), kw, p.stride_w, p.pad_w, p.dilation_w)};
  if (s[2] < 1 || s[3] < 1) cannot(path, fmt::format("Conv2d on a {} input leaves no output pixels", tracked_shape_str(x.shape)));
  std::vector<std::string> in{x.name, g.weight(path + ".weight", c.weight)};
  if (c.bias.defined()) in.push_back(g.weight(path + ".bias", c.bias));
  return g.node(path, "Conv", in, s, [&](onnx::NodeProto& n) {
    attr(n, "kernel_shape", std::vector<int64_t>{kh, kw});
    attr(n, "strides", std::vector<int64_t>{p.stride_h, p.stride_w});
    attr(n, "pads", std::vector<int64_t>{p.pad_h, p.pad_w, p.pad_h, p.pad_w});
    attr(n, "dilations", std::vector<int64_t>{p.dilation_h, p.dilation_w});
    attr(n, "group", p.groups);
  });
}

// y = x W^T + b over the last dim: Gemm on a matrix (PyTorch's export of nn.Linear), else MatMul with
// the weight stored transposed, then Add.
Value linear(OnnxGraph& g, const std::string& path, const Value& x, const std::string& weight_name, const Tensor& w,
             const std::string& bias_name, const Tensor& b) {
  const int64_t in = w.size(1), out = w.size(0);
  if (x.rank() < 2 || x.dim(-1) != in)
    cannot(path, fmt::format("a linear layer of {} input features receives shape {}", in, tracked_shape_str(x.shape)));
  Shape s = x.shape;
  s.back() = out;
  if (x.rank() == 2) {
    std::vector<std::string> ins{x.name, g.weight(weight_name, w)};
    if (b.defined()) ins.push_back(g.weight(bias_name, b));
    return g.node(path, "Gemm", ins, s, [](onnx::NodeProto& n) { attr(n, "transB", int64_t{1}); });
  }
  const Value y = g.node(path, "MatMul", {x.name, g.weight(weight_name + "_transposed", w.transpose(0, 1))}, s);
  return b.defined() ? binary(g, path, "Add", y, g.weight(bias_name, b), {out}) : y;
}

Value linear_module(OnnxGraph& g, const nn::Linear& l, const std::string& path, const Value& x) {
  return linear(g, path, x, path + ".weight", l.weight, path + ".bias", l.bias);
}

// Eval-mode batch norm: BatchNormalization with the running statistics (training_mode 0).
Value batch_norm(OnnxGraph& g, const nn::BatchNorm2d& bn, const std::string& path, const Value& x) {
  expect_rank(path, "BatchNorm2d", x, {2, 4});
  if (x.dim(1) != bn.weight.size(0))
    cannot(path, fmt::format("BatchNorm2d({}) receives {} channels", bn.weight.size(0), x.dim(1)));
  return g.node(path, "BatchNormalization",
                {x.name, g.weight(path + ".weight", bn.weight), g.weight(path + ".bias", bn.bias),
                 g.weight(path + ".running_mean", bn.running_mean), g.weight(path + ".running_var", bn.running_var)},
                x.shape, [&](onnx::NodeProto& n) {
                  attr(n, "epsilon", static_cast<float>(bn.eps));
                  attr(n, "momentum", static_cast<float>(1.0 - bn.momentum));  // ONNX's is the running stats' weight
                });
}

Value layer_norm(OnnxGraph& g, const nn::LayerNorm& ln, const std::string& path, const Value& x) {
  if (x.rank() < 1 || x.dim(-1) != ln.normalized_dim)
    cannot(path, fmt::format("LayerNorm({}) receives shape {}", ln.normalized_dim, tracked_shape_str(x.shape)));
  const Shape c{ln.normalized_dim};
  const std::string scale = ln.weight.defined() ? g.weight(path + ".weight", ln.weight)
                                                : g.floats(path + ".ones", std::vector<float>(static_cast<size_t>(c[0]), 1.f), c);
  std::vector<std::string> ins{x.name, scale};
  if (ln.bias.defined()) ins.push_back(g.weight(path + ".bias", ln.bias));
  return g.node(path, "LayerNormalization", ins, x.shape, [&](onnx::NodeProto& n) {
    attr(n, "axis", int64_t{-1});
    attr(n, "epsilon", static_cast<float>(ln.eps));
  });
}

// Each activation of engine/scalar_math.h (ActivationFn) in opset 17's terms.
Value activation(OnnxGraph& g, const std::string& path, Activation a, std::optional<double> alpha, const Value& x) {
  switch (a) {
    case Activation::relu: return unary(g, path, "Relu", x);
    case Activation::relu6:
      return g.node(path, "Clip", {x.name, g.floats(path + ".min", {0.f}, {}), g.floats(path + ".max", {6.f}, {})}, x.shape);
    case Activation::gelu_erf: {  // 0.5 x (1 + erf(x / sqrt 2)); opset 20 has Gelu, 17 does not
      const Value e = unary(g, path, "Erf", scalar_op(g, path, "Mul", x, static_cast<float>(1.0 / std::numbers::sqrt2)));
      return scalar_op(g, path, "Mul", binary(g, path, "Mul", x, scalar_op(g, path, "Add", e, 1.f)), 0.5f);
    }
    case Activation::gelu_tanh: {  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      const Value cube = binary(g, path, "Mul", binary(g, path, "Mul", x, x), x);
      const Value inner = scalar_op(g, path, "Mul", binary(g, path, "Add", x, scalar_op(g, path, "Mul", cube, 0.044715f)),
                                    static_cast<float>(std::sqrt(2.0 / std::numbers::pi)));
      const Value t = scalar_op(g, path, "Add", unary(g, path, "Tanh", inner), 1.f);
      return scalar_op(g, path, "Mul", binary(g, path, "Mul", x, t), 0.5f);
    }
    case Activation::sigmoid: return unary(g, path, "Sigmoid", x);
    case Activation::silu: return binary(g, path, "Mul", x, unary(g, path, "Sigmoid", x));
    case Activation::hardswish: return unary(g, path, "HardSwish", x);
    case Activation::leaky_relu: {
      const double slope = alpha.value_or(activation_default_alpha(a));
      return g.node(path, "LeakyRelu", {x.name}, x.shape,
                    [&](onnx::NodeProto& n) { attr(n, "alpha", static_cast<float>(slope)); });
    }
    case Activation::count: break;
  }
  cannot(path, fmt::format("activation {} has no ONNX translation", static_cast<int>(a)));
}

Value relu(OnnxGraph& g, const std::string& path, const Value& x) { return unary(g, path, "Relu", x); }

// Pooling windows as torch computes them (floor, or ceil without windows that start in the padding).
int64_t pooled(int64_t in, int64_t k, int64_t s, int64_t pad, bool ceil_mode) {
  const int64_t span = in + 2 * pad - k;
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + pad) --out;
  return out;
}

Value pool(OnnxGraph& g, const std::string& path, const char* op, const Pool2dParams& p, const Value& x, bool average) {
  expect_rank(path, op, x, {4});
  const Shape s{x.dim(0), x.dim(1), pooled(x.dim(2), p.kernel_h, p.stride_h, p.pad_h, p.ceil_mode),
                pooled(x.dim(3), p.kernel_w, p.stride_w, p.pad_w, p.ceil_mode)};
  return g.node(path, op, {x.name}, s, [&](onnx::NodeProto& n) {
    attr(n, "kernel_shape", std::vector<int64_t>{p.kernel_h, p.kernel_w});
    attr(n, "strides", std::vector<int64_t>{p.stride_h, p.stride_w});
    attr(n, "pads", std::vector<int64_t>{p.pad_h, p.pad_w, p.pad_h, p.pad_w});
    if (p.ceil_mode) attr(n, "ceil_mode", int64_t{1});
    if (average) attr(n, "count_include_pad", int64_t{p.count_include_pad ? 1 : 0});
  });
}

Value adaptive_avg_pool(OnnxGraph& g, const std::string& path, const Value& x, int64_t oh, int64_t ow) {
  expect_rank(path, "AdaptiveAvgPool2d", x, {4});
  if (oh == 1 && ow == 1) return g.node(path, "GlobalAveragePool", {x.name}, {x.dim(0), x.dim(1), 1, 1});
  // Equal windows side by side are a plain average pooling; uneven ones have no ONNX operator.
  if (x.dim(2) % oh != 0 || x.dim(3) % ow != 0)
    cannot(path, fmt::format("AdaptiveAvgPool2d(({}, {})) of a {}x{} map has windows of unequal sizes, which no ONNX "
                             "operator computes",
                             oh, ow, x.dim(2), x.dim(3)));
  const int64_t kh = x.dim(2) / oh, kw = x.dim(3) / ow;
  return pool(g, path, "AveragePool", Pool2dParams{kh, kw, kh, kw, 0, 0, true, false}, x, true);
}

Value sequential(OnnxGraph& g, const nn::Module& m, const std::string& path, const Value& x) {
  Value y = x;
  for (const auto& [name, child] : m.children()) y = call(g, *child, path, y);
  return y;
}


// ---- the zoo: shared blocks ------------------------------------------------------------------------
// LayerNorm over the channels at every pixel: NHWC, layer norm, NCHW, as LayerNorm2d::forward.
Value layer_norm_2d(OnnxGraph& g, const models::LayerNorm2d& ln, const std::string& path, const Value& x) {
  expect_rank(path, "LayerNorm2d", x, {4});
  const Value y = layer_norm(g, ln, path, transpose(g, path, x, {0, 2, 3, 1}));
  return transpose(g, path, y, {0, 3, 1, 2});
}

// x + weight * (x * n) + bias with n = |x|_2 over the pixels / (mean over channels + eps), NHWC.
Value global_response_norm(OnnxGraph& g, const models::GlobalResponseNorm& m, const std::string& path, const Value& x) {
  expect_rank(path, "GlobalResponseNorm", x, {4});
  const Shape per_channel{x.dim(0), 1, 1, x.dim(3)};
  const Value norm = g.node(path, "ReduceL2", {x.name}, per_channel, [](onnx::NodeProto& n) {
    attr(n, "axes", std::vector<int64_t>{1, 2});
    attr(n, "keepdims", int64_t{1});
  });
  const Value mean = g.node(path, "ReduceMean", {norm.name}, {x.dim(0), 1, 1, 1}, [](onnx::NodeProto& n) {
    attr(n, "axes", std::vector<int64_t>{-1});
    attr(n, "keepdims", int64_t{1});
  });
  const Value rel = binary(g, path, "Div", norm, scalar_op(g, path, "Add", mean, static_cast<float>(m.eps)));
  const Value scaled = binary(g, path, "Mul", binary(g, path, "Mul", x, rel), g.weight(path + ".weight", m.weight), {m.channels});
  return binary(g, path, "Add", binary(g, path, "Add", scaled, g.weight(path + ".bias", m.bias), {m.channels}), x);
}

// ---- ResNet --------------------------------------------------------------------------------------
Value resnet_basic(OnnxGraph& g, const models::BasicBlock& b, const std::string& path, const Value& x) {
  Value out = relu(g, path, call(g, *b.bn1, path, call(g, *b.conv1, path, x)));
  out = call(g, *b.bn2, path, call(g, *b.conv2, path, out));
  const Value identity = b.downsample ? call(g, *b.downsample, path, x) : x;
  return relu(g, path, binary(g, path, "Add", out, identity));
}

Value resnet_bottleneck(OnnxGraph& g, const models::Bottleneck& b, const std::string& path, const Value& x) {
  Value out = relu(g, path, call(g, *b.bn1, path, call(g, *b.conv1, path, x)));
  out = relu(g, path, call(g, *b.bn2, path, call(g, *b.conv2, path, out)));
  out = call(g, *b.bn3, path, call(g, *b.conv3, path, out));
  const Value identity = b.downsample ? call(g, *b.downsample, path, x) : x;
  return relu(g, path, binary(g, path, "Add", out, identity));
}

Value resnet(OnnxGraph& g, const models::ResNet& r, const std::string& path, const Value& x) {
  Value y = call(g, *r.maxpool, path, relu(g, path, call(g, *r.bn1, path, call(g, *r.conv1, path, x))));
  for (const auto& layer : {r.layer1, r.layer2, r.layer3, r.layer4}) y = call(g, *layer, path, y);
  return call(g, *r.fc, path, flatten(g, path, call(g, *r.avgpool, path, y), 1, -1));
}

// ---- DenseNet ------------------------------------------------------------------------------------
Value dense_layer(OnnxGraph& g, const models::DenseLayer& l, const std::string& path, const Value& x) {
  const Value bottleneck = call(g, *l.conv1, path, relu(g, path, call(g, *l.norm1, path, x)));
  return call(g, *l.conv2, path, relu(g, path, call(g, *l.norm2, path, bottleneck)));  // dropout: none in eval
}

Value dense_block(OnnxGraph& g, const models::DenseBlock& b, const std::string& path, const Value& x) {
  std::vector<Value> features{x};
  for (const auto& layer : b.layers)
    features.push_back(call(g, *layer, path, features.size() == 1 ? x : concat(g, path, features, 1)));
  return concat(g, path, features, 1);
}

// Global average pooling and flatten: the adaptive_avg_pool2d(f, 1, 1).flatten(1) of the forwards.
Value pooled_features(OnnxGraph& g, const std::string& path, const Value& x) {
  return flatten(g, path, adaptive_avg_pool(g, path, x, 1, 1), 1, -1);
}

Value densenet(OnnxGraph& g, const models::DenseNet& d, const std::string& path, const Value& x) {
  const Value f = relu(g, path, call(g, *d.features, path, x));
  return call(g, *d.classifier, path, pooled_features(g, path, f));
}

// ---- MobileNet -----------------------------------------------------------------------------------
Value mobilenet_v1(OnnxGraph& g, const models::MobileNetV1& m, const std::string& path, const Value& x) {
  return call(g, *m.classifier, path, pooled_features(g, path, call(g, *m.features, path, x)));
}

Value mobilenet_v2(OnnxGraph& g, const models::MobileNetV2& m, const std::string& path, const Value& x) {
  return call(g, *m.classifier, path, pooled_features(g, path, call(g, *m.features, path, x)));
}

Value inverted_residual(OnnxGraph& g, const models::InvertedResidual& r, const std::string& path, const Value& x) {
  const Value y = call(g, *r.conv, path, x);  // ends in the batch norm; forward() fuses the add into it
  return r.use_res_connect ? binary(g, path, "Add", y, x) : y;
}

// ---- ViT and DeiT --------------------------------------------------------------------------------
// softmax(q k^T / sqrt(Dh)) v per head from the packed projection, as engine/ops/attention.cpp's
// composed_attention: [N, S, 3D] -> [N, S, 3, H, Dh] -> [3, N, H, S, Dh].
Value self_attention(OnnxGraph& g, const models::MultiheadSelfAttention& a, const std::string& path, const Value& x) {
  expect_rank(path, "MultiheadAttention", x, {3});
  const int64_t S = x.dim(1), D = a.dim, H = a.num_heads, Dh = D / H;
  const Value qkv = linear(g, path, x, path + ".in_proj_weight", a.in_proj_weight, path + ".in_proj_bias", a.in_proj_bias);
  const Value heads = transpose(g, path, reshape(g, path, qkv, {kBatch, S, 3, H, Dh}), {2, 0, 3, 1, 4});
  const Value q = scalar_op(g, path, "Mul", select(g, path, heads, 0, 0), static_cast<float>(1.0 / std::sqrt(double(Dh))));
  const Value k = select(g, path, heads, 0, 1), v = select(g, path, heads, 0, 2);
  const Value scores = g.node(path, "MatMul", {q.name, transpose(g, path, k, {0, 1, 3, 2}).name}, {kBatch, H, S, S});
  const Value probs = g.node(path, "Softmax", {scores.name}, scores.shape, [](onnx::NodeProto& n) { attr(n, "axis", int64_t{-1}); });
  const Value out = g.node(path, "MatMul", {probs.name, v.name}, {kBatch, H, S, Dh});
  return call(g, *a.out_proj, path, reshape(g, path, transpose(g, path, out, {0, 2, 1, 3}), {kBatch, S, D}));
}

Value encoder_block(OnnxGraph& g, const models::EncoderBlock& b, const std::string& path, const Value& x) {
  const Value attn = call(g, *b.dropout, path, call(g, *b.self_attention, path, call(g, *b.ln_1, path, x)));
  const Value h = binary(g, path, "Add", attn, x);
  return binary(g, path, "Add", h, call(g, *b.mlp, path, call(g, *b.ln_2, path, h)));
}

Value encoder(OnnxGraph& g, const models::Encoder& e, const std::string& path, const Value& x) {
  if (x.rank() != 3 || x.dim(1) != e.pos_embedding.size(1) || x.dim(2) != e.pos_embedding.size(2))
    cannot(path, fmt::format("Encoder receives shape {}, expected [batch, {}, {}]", tracked_shape_str(x.shape),
                             e.pos_embedding.size(1), e.pos_embedding.size(2)));
  const Value y = binary(g, path, "Add", x, g.weight(path + ".pos_embedding", e.pos_embedding), e.pos_embedding.shape());
  return call(g, *e.ln, path, call(g, *e.layers, path, call(g, *e.dropout, path, y)));
}

Value vision_transformer(OnnxGraph& g, const models::VisionTransformer& v, const std::string& path, const Value& x) {
  const models::ViTConfig& c = v.config;
  if (x.rank() != 4 || x.dim(2) != c.image_size || x.dim(3) != c.image_size)
    cannot(path, fmt::format("VisionTransformer for {0}x{0} images receives shape {1} (the position embedding fixes "
                             "the image size)",
                             c.image_size, tracked_shape_str(x.shape)));
  const int64_t D = c.hidden_dim, side = c.image_size / c.patch_size;
  // [N, D, h, w] -> [N, h*w, D]: one token per patch.
  const Value p = call(g, *v.conv_proj, path, x);
  const Value patches = transpose(g, path, reshape(g, path, p, {kBatch, D, side * side}), {0, 2, 1});
  // The tokens [1, 1, D] expanded to the batch: Expand to (N, 1, D), N read from the input's shape.
  const Value n = g.node(path, "Shape", {x.name}, {1}, [](onnx::NodeProto& nd) {
    attr(nd, "start", int64_t{0});
    attr(nd, "end", int64_t{1});
  });
  const Value expand_to = g.node(path, "Concat", {n.name, g.ints(path + ".token_shape", {1, D})}, {3},
                                 [](onnx::NodeProto& nd) { attr(nd, "axis", int64_t{0}); });
  const auto token = [&](const std::string& name, const Tensor& t) {
    return g.node(path, "Expand", {g.weight(name, t), expand_to.name}, {kBatch, 1, D});
  };
  const std::string prefix = path.empty() ? "" : path + ".";
  std::vector<Value> tokens{token(prefix + "class_token", v.class_token)};
  if (c.distilled) tokens.push_back(token(prefix + "dist_token", v.dist_token));
  tokens.push_back(patches);
  const Value h = call(g, *v.encoder, path, concat(g, path, tokens, 1));
  const Value logits = call(g, *v.heads, path, select(g, path, h, 1, 0));
  if (!c.distilled) return logits;
  const Value dist = call(g, *v.head_dist, path, select(g, path, h, 1, 1));
  return scalar_op(g, path, "Mul", binary(g, path, "Add", logits, dist), 0.5f);
}

// ---- ConvNeXt ------------------------------------------------------------------------------------
Value cn_block(OnnxGraph& g, const models::CNBlock& b, const std::string& path, const Value& x) {
  Value branch = call(g, *b.block, path, x);
  if (b.layer_scale.defined())
    branch = binary(g, path, "Mul", branch, g.weight(path + ".layer_scale", b.layer_scale), b.layer_scale.shape());
  return binary(g, path, "Add", call(g, *b.stochastic_depth, path, branch), x);
}

Value convnext(OnnxGraph& g, const models::ConvNeXt& m, const std::string& path, const Value& x) {
  return call(g, *m.classifier, path, call(g, *m.avgpool, path, call(g, *m.features, path, x)));
}

// ---- teaching models -----------------------------------------------------------------------------
Value small_cnn(OnnxGraph& g, const models::SmallCNN& m, const std::string& path, const Value& x) {
  return call(g, *m.classifier, path, call(g, *m.features, path, x));
}

Value mlp(OnnxGraph& g, const models::MLP& m, const std::string& path, const Value& x) {
  return call(g, *m.layers, path, flatten(g, path, x, 1, -1));
}

// ---- the table -----------------------------------------------------------------------------------
template <class M>
void add(Table& t, const std::string& type, Value (*fn)(OnnxGraph&, const M&, const std::string&, const Value&)) {
  // The entry casts back to M: translate() finds it by M's exact type.
  t.emplace(std::type_index(typeid(M)),
            Entry{type, [fn](OnnxGraph& g, const nn::Module& m, const std::string& p, const Value& x) {
                    return fn(g, static_cast<const M&>(m), p, x);
                  }});
}

// A module that computes nothing in eval mode (dropout, identity, stochastic depth).
template <class M>
void add_identity(Table& t, const std::string& type) {
  t.emplace(std::type_index(typeid(M)),
            Entry{type, [](OnnxGraph&, const nn::Module&, const std::string&, const Value& x) { return x; }});
}

const Table& table() {
  static const Table t = [] {
    Table t;
    // engine/nn
    add<nn::Conv2d>(t, "Conv2d", conv2d);
    add<nn::Linear>(t, "Linear", linear_module);
    add<nn::BatchNorm2d>(t, "BatchNorm2d", batch_norm);
    add<nn::LayerNorm>(t, "LayerNorm", layer_norm);
    add<nn::Act>(t, "activations (ReLU, ReLU6, GELU, Sigmoid, SiLU, Hardswish, LeakyReLU)",
                 +[](OnnxGraph& g, const nn::Act& a, const std::string& p, const Value& x) {
                   return activation(g, p, a.act, a.alpha, x);
                 });
    add<nn::MaxPool2d>(t, "MaxPool2d", +[](OnnxGraph& g, const nn::MaxPool2d& m, const std::string& p, const Value& x) {
      return pool(g, p, "MaxPool", m.params, x, false);
    });
    add<nn::AvgPool2d>(t, "AvgPool2d", +[](OnnxGraph& g, const nn::AvgPool2d& m, const std::string& p, const Value& x) {
      return pool(g, p, "AveragePool", m.params, x, true);
    });
    add<nn::AdaptiveAvgPool2d>(
        t, "AdaptiveAvgPool2d", +[](OnnxGraph& g, const nn::AdaptiveAvgPool2d& m, const std::string& p, const Value& x) {
          return adaptive_avg_pool(g, p, x, m.out_h, m.out_w);
        });
    add<nn::Flatten>(t, "Flatten", +[](OnnxGraph& g, const nn::Flatten& m, const std::string& p, const Value& x) {
      return flatten(g, p, x, m.start, m.end);
    });
    add_identity<nn::Dropout>(t, "Dropout");
    add_identity<nn::Identity>(t, "Identity");
    add<nn::Sequential>(t, "Sequential", +[](OnnxGraph& g, const nn::Sequential& m, const std::string& p, const Value& x) {
      return sequential(g, m, p, x);
    });
    // models/blocks.h
    add<models::ConvBnAct>(t, "Conv2dNormActivation",
                           +[](OnnxGraph& g, const models::ConvBnAct& m, const std::string& p, const Value& x) {
                             return sequential(g, m, p, x);
                           });
    add<models::Permute>(t, "Permute", +[](OnnxGraph& g, const models::Permute& m, const std::string& p, const Value& x) {
      return transpose(g, p, x, m.dims);
    });
    add<models::LayerNorm2d>(t, "LayerNorm2d", layer_norm_2d);
    add<models::GlobalResponseNorm>(t, "GlobalResponseNorm", global_response_norm);
    add_identity<models::StochasticDepth>(t, "StochasticDepth");
    // the families
    add<models::BasicBlock>(t, "BasicBlock", resnet_basic);
    add<models::Bottleneck>(t, "Bottleneck", resnet_bottleneck);
    add<models::ResNet>(t, "ResNet", resnet);
    add<models::DenseLayer>(t, "_DenseLayer", dense_layer);
    add<models::DenseBlock>(t, "_DenseBlock", dense_block);
    add<models::DenseNet>(t, "DenseNet", densenet);
    add<models::DepthwiseSeparable>(
        t, "DepthwiseSeparable",
        +[](OnnxGraph& g, const models::DepthwiseSeparable& m, const std::string& p, const Value& x) {
          return call(g, *m.conv, p, x);
        });
    add<models::MobileNetV1>(t, "MobileNetV1", mobilenet_v1);
    add<models::InvertedResidual>(t, "InvertedResidual", inverted_residual);
    add<models::MobileNetV2>(t, "MobileNetV2", mobilenet_v2);
    add<models::MultiheadSelfAttention>(t, "MultiheadAttention", self_attention);
    add<models::EncoderBlock>(t, "EncoderBlock", encoder_block);
    add<models::Encoder>(t, "Encoder", encoder);
    add<models::VisionTransformer>(t, "VisionTransformer", vision_transformer);
    add<models::CNBlock>(t, "CNBlock", cn_block);
    add<models::ConvNeXt>(t, "ConvNeXt", convnext);
    add<models::SmallCNN>(t, "SmallCNN", small_cnn);
    add<models::MLP>(t, "MLP", mlp);
    return t;
  }();
  return t;
}

}  // namespace

Value translate(OnnxGraph& g, const nn::Module& m, const std::string& path, const Value& x) {
  const auto it = table().find(std::type_index(typeid(m)));
  if (it == table().end())
    cannot(path, fmt::format("its type {} has no ONNX translation (export/onnx_modules.cpp translates {})", m.type_name(),
                             fmt::join(translatable_types(), ", ")));
  return it->second.fn(g, m, path, x);
}

std::vector<std::string> translatable_types() {
  std::vector<std::string> names;
  for (const auto& [type, e] : table()) names.push_back(e.type);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace duet::exporter
