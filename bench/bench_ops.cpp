// Per-op microbenchmarks on the shapes duet's models really run (ResNet-18 on CIFAR, MobileNetV2,
// DenseNet, ViT-tiny), for the `cpu` backend and, with one iteration each, the `reference`
// backend. Each benchmark is named "<op>_<fwd|fwdbwd>/<shape>/<backend>"; bench/torch_ops.py
// times the same names with PyTorch and bench/compare_ops.py prints the ratios. FLOP and byte
// counters come from the engine's own cost formulas (engine/op_cost.h), so GFLOP/s here and in
// the profiler mean the same thing.
//
//   duet_bench_ops --benchmark_filter=/cpu --benchmark_format=json > duet_ops.json
#include <benchmark/benchmark.h>
#include <fmt/format.h>
#include <functional>
#include <string>
#include <vector>
#include "engine/autograd.h"
#include "engine/duet.h"
#include "engine/op_cost.h"
#include "engine/profiler/events.h"
#include "opcheck/op_check.h"

namespace duet {
namespace {

using Inputs = std::vector<Tensor>;
using OpFn = std::function<Tensor(const Inputs&)>;

// What one benchmark needs: inputs (made per backend), the op, and its cost per iteration.
struct OpSpec {
  std::string op, shape;
  std::vector<Shape> shapes;
  std::vector<bool> channels_last;  // per input; missing = contiguous
  OpFn f;
  OpCost fwd_cost, bwd_cost;  // bwd_cost: the extra work of the backward pass
  bool backward = true;
  bool on_reference = true;  // also register the reference backend's run (one iteration)
  std::vector<int64_t> labels;  // > 0 at index i: input i holds i64 labels in [0, labels[i])
  int64_t positive = -1;        // this input holds |randn| (Adam's second moment)
};

Tensor make_input(const OpSpec& s, size_t i, bool grad) {
  Generator g(1234 + i);
  if (i < s.labels.size() && s.labels[i] > 0) {
    std::vector<int64_t> v(static_cast<size_t>(numel_of(s.shapes[i])));
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<int64_t>(k % static_cast<size_t>(s.labels[i]));
    return Tensor::from_vector<int64_t>(v, s.shapes[i], TensorOptions(DType::i64));
  }
  Tensor t = Tensor::randn(s.shapes[i], {}, &g);
  if (static_cast<int64_t>(i) == s.positive) t = abs(t);
  if (i < s.channels_last.size() && s.channels_last[i]) t = t.contiguous(MemoryFormat::channels_last);
  t = t.detach();
  if (grad) t.set_requires_grad(true);
  return t;
}

void set_counters(benchmark::State& st, const OpCost& c) {
  st.counters["GFLOP"] = benchmark::Counter(c.flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  st.counters["GB"] = benchmark::Counter(c.bytes / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void register_spec(const OpSpec& s) {
  for (Backend b : {Backend::cpu, Backend::reference}) {
    if (!backend_available(b) || (b == Backend::reference && !s.on_reference)) continue;
    for (int pass = 0; pass < (s.backward ? 2 : 1); ++pass) {
      const bool bwd = pass == 1;
      const std::string name = s.op + (bwd ? "_fwdbwd/" : "_fwd/") + s.shape + "/" + backend_name(b);
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), [s, b, bwd](benchmark::State& st) {
        BackendGuard guard(DeviceType::cpu, b);
        Inputs in;
        for (size_t i = 0; i < s.shapes.size(); ++i) in.push_back(make_input(s, i, bwd));
        Tensor dy;
        if (bwd) {
          NoGradGuard ng;
          const Tensor y = s.f(in);
          Generator g(99);
          dy = Tensor::randn(y.shape(), {}, &g);
          if (y.dim() == 4 && !y.is_contiguous()) dy = dy.contiguous(MemoryFormat::channels_last);
        }
        for (auto _ : st) {
          if (bwd) {
            Tensor y = s.f(in);
            y.backward(dy);
            for (const Tensor& t : in)
              if (t.requires_grad()) t.zero_grad();
          } else {
            NoGradGuard ng;
            Tensor y = s.f(in);
            benchmark::DoNotOptimize(y.raw_data());
          }
        }
        OpCost c = s.fwd_cost;
        if (bwd) c.flops += s.bwd_cost.flops, c.bytes += s.bwd_cost.bytes;
        set_counters(st, c);
      });
      bm->UseRealTime()->Unit(benchmark::kMicrosecond);
      if (b == Backend::reference) bm->Iterations(1);
    }
  }
}

Conv2dParams conv_p(int64_t stride, int64_t pad, int64_t groups = 1) {
  Conv2dParams p;
  p.stride_h = p.stride_w = stride;
  p.pad_h = p.pad_w = pad;
  p.groups = groups;
  return p;
}

void conv(const std::string& shape, Shape x, int64_t O, int64_t K, Conv2dParams p, bool nhwc) {
  const int64_t OH = conv_out_size(x[2], K, p.stride_h, p.pad_h, 1), OW = conv_out_size(x[3], K, p.stride_w, p.pad_w, 1);
  const Shape w{O, x[1] / p.groups, K, K}, y{x[0], O, OH, OW};
  const OpCost c = cost::conv2d(x, w, y, 4, false);
  OpSpec s{"conv2d", shape, {x, w}, {nhwc, false}, [p](const Inputs& t) { return conv2d(t[0], t[1], Tensor(), p); },
           c, {2 * c.flops, 2 * c.bytes}};
  register_spec(s);
}

void register_all() {
  // ---- convolutions --------------------------------------------------------------------------
  conv("resnet_l1_64x64_32_nhwc", {64, 64, 32, 32}, 64, 3, conv_p(1, 1), true);
  conv("resnet_l1_64x64_32_nchw", {64, 64, 32, 32}, 64, 3, conv_p(1, 1), false);
  conv("resnet_l3_256x256_8_nhwc", {64, 256, 8, 8}, 256, 3, conv_p(1, 1), true);
  conv("resnet_down_128x256_s2_nhwc", {64, 128, 16, 16}, 256, 3, conv_p(2, 1), true);
  conv("cifar_stem_3x64_32_nhwc", {64, 3, 32, 32}, 64, 3, conv_p(1, 1), true);
  conv("cifar_stem_3x64_32_nchw", {64, 3, 32, 32}, 64, 3, conv_p(1, 1), false);
  conv("mbv2_dw3x3_144_16_nhwc", {64, 144, 16, 16}, 144, 3, conv_p(1, 1, 144), true);
  conv("mbv2_dw3x3_144_16_nchw", {64, 144, 16, 16}, 144, 3, conv_p(1, 1, 144), false);
  conv("mbv2_expand1x1_24x144_16_nhwc", {64, 24, 16, 16}, 144, 1, conv_p(1, 0), true);
  conv("mbv2_expand1x1_24x144_16_nchw", {64, 24, 16, 16}, 144, 1, conv_p(1, 0), false);
  conv("mbv2_project1x1_144x24_16_nhwc", {64, 144, 16, 16}, 24, 1, conv_p(1, 0), true);
  conv("densenet_bottleneck1x1_160x128_16_nhwc", {64, 160, 16, 16}, 128, 1, conv_p(1, 0), true);
  conv("densenet_growth3x3_128x32_16_nhwc", {64, 128, 16, 16}, 32, 3, conv_p(1, 1), true);
  // DenseNet-121 on 32x32 inputs runs its last two blocks on 2x2 and 1x1 maps (where a 3x3 kernel
  // mostly reads padding), and MobileNetV2 its last stages on 2x2 and 1x1 maps.
  conv("densenet_growth3x3_128x32_2_nhwc", {64, 128, 2, 2}, 32, 3, conv_p(1, 1), true);
  conv("densenet_growth3x3_128x32_1_nhwc", {64, 128, 1, 1}, 32, 3, conv_p(1, 1), true);
  conv("densenet_bottleneck1x1_512x128_2_nhwc", {64, 512, 2, 2}, 128, 1, conv_p(1, 0), true);
  conv("mbv2_dw3x3_576_2_nhwc", {64, 576, 2, 2}, 576, 3, conv_p(1, 1, 576), true);
  conv("mbv2_dw3x3_960_1_nhwc", {64, 960, 1, 1}, 960, 3, conv_p(1, 1, 960), true);
  conv("convnext_dw7x7_96_16_nhwc", {64, 96, 16, 16}, 96, 7, conv_p(1, 3, 96), true);  // ConvNeXt-T at 64 px
  // MobileNetV2's depthwise layers at 32 px for one image and for eight (inference latency): small
  // enough that a call's fixed cost weighs against its arithmetic.
  for (const int64_t n : {1, 8}) {
    for (const auto& [c, hw] : {std::pair<int64_t, int64_t>{96, 16}, {144, 8}, {192, 4}, {384, 2}, {960, 1}})
      conv(fmt::format("mbv2_dw3x3_{}_{}_b{}_nhwc", c, hw, n), {n, c, hw, hw}, c, 3, conv_p(1, 1, c), true);
  }
  conv("mbv2_project1x1_960x160_1_nhwc", {64, 960, 1, 1}, 160, 1, conv_p(1, 0), true);
  conv("resnet_l4_512x512_4_nhwc", {64, 512, 4, 4}, 512, 3, conv_p(1, 1), true);
  {
    // conv + bias + ReLU, the ReLU fused as a oneDNN post-op (its backward masks with the output).
    const Shape x{64, 64, 32, 32}, w{64, 64, 3, 3}, y{64, 64, 32, 32};
    const OpCost c = cost::conv2d(x, w, y, 4, true);
    Conv2dParams p = conv_p(1, 1);
    p.act = Activation::relu;
    register_spec({"conv2d_bias_relu", "resnet_l1_64x64_32_nhwc", {x, w, {64}}, {true, false},
                   [p](const Inputs& t) { return conv2d(t[0], t[1], t[2], p); }, c, {2 * c.flops, 2 * c.bytes}});
  }

  // ---- the fp32 GEMM ceiling: the 2048^3 product `duet probe` times. bench/ceiling.py divides
  // the GEMM-bound ops' GFLOP/s by it, measured in the same round.
  {
    const OpCost c = cost::matmul(1, 2048, 2048, 2048, 4);
    OpSpec s{"matmul", "gemm_ceiling_2048", {{2048, 2048}, {2048, 2048}}, {},
             [](const Inputs& t) { return matmul(t[0], t[1]); }, c, {}};
    s.backward = false;
    s.on_reference = false;  // 17 GFLOP: half a minute of naive loops
    register_spec(s);
  }

  // ---- ViT-tiny: tokens 65, width 192, MLP 768, 3 heads of 64, batch 64 -------------------------
  auto lin = [](const std::string& shape, int64_t rows, int64_t in, int64_t out) {
    const OpCost c = cost::matmul(1, rows, out, in, 4, true);
    register_spec({"linear", shape, {{64, rows / 64, in}, {out, in}, {out}}, {},
                   [](const Inputs& t) { return linear(t[0], t[1], t[2]); }, c, {2 * c.flops, 2 * c.bytes}});
  };
  lin("vit_qkv_4160x192x576", 64 * 65, 192, 576);
  lin("vit_fc1_4160x192x768", 64 * 65, 192, 768);
  lin("vit_fc2_4160x768x192", 64 * 65, 768, 192);
  {
    const OpCost c = cost::matmul(64 * 3, 65, 65, 64, 4);
    register_spec({"matmul", "vit_attn_qk_192x65x64x65", {{64, 3, 65, 64}, {64, 3, 65, 64}}, {},
                   [](const Inputs& t) { return matmul(t[0], t[1].transpose(-1, -2)); }, c, {2 * c.flops, 2 * c.bytes}});
    const OpCost c2 = cost::matmul(64 * 3, 65, 64, 65, 4);
    register_spec({"matmul", "vit_attn_av_192x65x65x64", {{64, 3, 65, 65}, {64, 3, 65, 64}}, {},
                   [](const Inputs& t) { return matmul(t[0], t[1]); }, c2, {2 * c2.flops, 2 * c2.bytes}});
  }
  {
    const Shape x{64, 65, 192};
    register_spec({"layer_norm", "vit_64x65x192", {x, {192}, {192}}, {},
                   [](const Inputs& t) { return layer_norm(t[0], t[1], t[2]); }, cost::layer_norm(x, 4),
                   cost::layer_norm_backward(x, 4)});
    const Shape h{64, 65, 768};
    const double n = static_cast<double>(numel_of(h));
    register_spec({"gelu", "vit_64x65x768", {h}, {}, [](const Inputs& t) { return gelu(t[0]); }, {8 * n, 8 * n},
                   {9 * n, 12 * n}});
    const Shape a{64, 3, 65, 65};
    register_spec({"softmax", "vit_attn_64x3x65x65", {a}, {}, [](const Inputs& t) { return softmax(t[0], -1); },
                   cost::softmax(a, 4), cost::softmax(a, 4)});
    // The whole self-attention of one block (the fused op on cpu): q k^T, softmax, times v.
    const Shape qkv{64, 65, 3 * 192};
    register_spec({"attention", "vit_64x65x3x64", {qkv}, {}, [](const Inputs& t) { return attention(t[0], 3); },
                   cost::attention(qkv, 3, 4, false), cost::attention(qkv, 3, 4, true)});
  }

  // ---- normalisation, activations, pooling, residual adds (ResNet-18 CIFAR layer 1) ----------------
  {
    const Shape x{64, 64, 32, 32};
    const double n = static_cast<double>(numel_of(x));
    BatchNormParams bp;
    register_spec({"batch_norm", "resnet_64x64x32x32_nhwc", {x, {64}, {64}}, {true},
                   [bp](const Inputs& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), bp); },
                   cost::batch_norm(x, 4, true), cost::batch_norm_backward(x, 4)});
    register_spec({"batch_norm", "resnet_64x64x32x32_nchw", {x, {64}, {64}}, {false},
                   [bp](const Inputs& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), bp); },
                   cost::batch_norm(x, 4, true), cost::batch_norm_backward(x, 4)});
    register_spec({"relu", "resnet_64x64x32x32_nhwc", {x}, {true}, [](const Inputs& t) { return relu(t[0]); },
                   {n, 8 * n}, {2 * n, 12 * n}});
    // Every activation of engine/scalar_math.h on the same layer, with its default parameter: a new
    // activation is benchmarked without an edit here (bench/torch_ops.py names PyTorch's for each).
    for (Activation a : all_activations())
      register_spec({std::string("act_") + activation_name(a), "resnet_64x64x32x32_nhwc", {x}, {true},
                     [a](const Inputs& t) { return activation(a, t[0]); }, {activation_flops(a) * n, 8 * n},
                     {(activation_flops(a) + 1) * n, 12 * n}});
    for (Activation a : {Activation::relu, Activation::relu6}) {
      BatchNormParams bpr;
      bpr.act = a;
      register_spec({std::string("batch_norm_") + activation_name(a), "resnet_64x64x32x32_nhwc", {x, {64}, {64}}, {true},
                     [bpr](const Inputs& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), bpr); },
                     cost::batch_norm(x, 4, true), cost::batch_norm_backward(x, 4)});
    }
    // ResNet-50 CIFAR's bottleneck outputs: 256 channels at 32x32 (each tensor twice the L3) and
    // 2048 channels at 4x4 (few rows, wide ones).
    for (const Shape& w : {Shape{64, 256, 32, 32}, Shape{64, 2048, 4, 4}}) {
      const std::string tag = fmt::format("resnet50_{}x{}x{}x{}_nhwc", w[0], w[1], w[2], w[3]);
      register_spec({"batch_norm", tag, {w, {w[1]}, {w[1]}}, {true},
                     [bp](const Inputs& t) { return batch_norm(t[0], t[1], t[2], Tensor(), Tensor(), bp); },
                     cost::batch_norm(w, 4, true), cost::batch_norm_backward(w, 4)});
    }
    register_spec({"add", "resnet_residual_64x64x32x32_nhwc", {x, x}, {true, true},
                   [](const Inputs& t) { return add(t[0], t[1]); }, {n, 12 * n}, {0, 8 * n}});
    // DenseNet's gradient accumulation: the cat backward hands each earlier feature map a
    // channel slice of the concatenated gradient, and autograd adds the slices up.
    {
      const Shape cs{64, 32, 2, 2};
      const double m = static_cast<double>(numel_of(cs));
      register_spec({"add", "densenet_grad_slices_64x32x2x2_of_256_nhwc", {{64, 256, 2, 2}, {64, 256, 2, 2}},
                     {true, true}, [](const Inputs& t) { return add(t[0].slice(1, 0, 32), t[1].slice(1, 64, 96)); },
                     {m, 12 * m}, {0, 8 * m}});
    }
    register_spec({"add", "bias_broadcast_64x64x32x32_nhwc", {x, {1, 64, 1, 1}}, {true, false},
                   [](const Inputs& t) { return add(t[0], t[1]); }, {n, 8 * n}, {n, 8 * n}});
    register_spec({"mul_scalar", "64x64x32x32", {x}, {false}, [](const Inputs& t) { return mul(t[0], 0.5); },
                   {n, 8 * n}, {n, 8 * n}});
    Pool2dParams mp;
    mp.kernel_h = mp.kernel_w = 3;
    mp.pad_h = mp.pad_w = 1;
    const Shape py{64, 64, 16, 16};
    register_spec({"max_pool2d", "3x3s2_64x64x32x32_nhwc", {x}, {true},
                   [mp](const Inputs& t) { return max_pool2d(t[0], mp); }, cost::pool2d(x, py, 3, 3, 4),
                   cost::pool2d(x, py, 3, 3, 4)});
    Pool2dParams ap;
    register_spec({"avg_pool2d", "densenet_transition_2x2_64x128x16x16_nhwc", {{64, 128, 16, 16}}, {true},
                   [ap](const Inputs& t) { return avg_pool2d(t[0], ap); },
                   cost::pool2d({64, 128, 16, 16}, {64, 128, 8, 8}, 2, 2, 4),
                   cost::pool2d({64, 128, 16, 16}, {64, 128, 8, 8}, 2, 2, 4)});
    const Shape g{64, 512, 4, 4};
    register_spec({"adaptive_avg_pool2d", "global_64x512x4x4_nhwc", {g}, {true},
                   [](const Inputs& t) { return adaptive_avg_pool2d(t[0], 1, 1); }, cost::pool2d(g, {64, 512, 1, 1}, 4, 4, 4),
                   cost::pool2d(g, {64, 512, 1, 1}, 4, 4, 4)});
    register_spec({"sum", "channels_64x64x32x32", {x}, {false}, [](const Inputs& t) { return sum(t[0], {0, 2, 3}); },
                   cost::reduce(x, {1, 64, 1, 1}, 4), {0, 4 * n}});
  }
  {
    const Shape a{64, 128, 16, 16}, b{64, 32, 16, 16};
    const double bytes = 2.0 * 4 * (numel_of(a) + numel_of(b));
    register_spec({"cat", "densenet_128+32_16x16_nhwc", {a, b}, {true, true},
                   [](const Inputs& t) { return cat(t, 1); }, {0, bytes}, {0, bytes}});
  }
  {
    const Shape l{256, 10};
    OpSpec s{"cross_entropy", "cifar_256x10", {l, {256}}, {}, [](const Inputs& t) { return cross_entropy(t[0], t[1], 0.1); },
             cost::cross_entropy(l, 4), cost::cross_entropy(l, 4)};
    s.labels = {0, 10};
    register_spec(s);
  }
  // ---- optimizer: one ResNet-18-sized parameter tensor (the 512x512x3x3 conv) ----------------------
  {
    const Shape w{512, 512, 3, 3};
    const double n = static_cast<double>(numel_of(w));
    OpSpec sgd{"sgd_momentum", "resnet_512x512x3x3", {w, w, w}, {}, [](const Inputs& t) {
                 SgdParams p;
                 p.momentum = 0.9;
                 p.weight_decay = 5e-4;
                 sgd_step_(t[0], t[1], t[2], p, false);
                 return t[0];
               },
               {5 * n, 20 * n}, {}};
    sgd.backward = false;
    register_spec(sgd);
    OpSpec adam{"adamw", "resnet_512x512x3x3", {w, w, w, w}, {}, [](const Inputs& t) {
                  AdamParams p;
                  p.decoupled = true;
                  p.weight_decay = 0.05;
                  p.step = 10;
                  adam_step_(t[0], t[1], t[2], t[3], p);
                  return t[0];
                },
                {12 * n, 28 * n}, {}};
    adam.backward = false;
    adam.positive = 3;
    register_spec(adam);
  }
}

// The floor of one op's cost: a 16-element add, end to end through the front-end, profiling off
// and on (target: < 2 us).
void dispatch_overhead(benchmark::State& st, bool profile) {
  BackendGuard guard(DeviceType::cpu, backend_available(Backend::cpu) ? Backend::cpu : Backend::reference);
  const Tensor a = Tensor::ones({16}), b = Tensor::ones({16});
  profiler::enable(profile);
  int64_t k = 0;
  for (auto _ : st) {
    Tensor c = add(a, b);
    benchmark::DoNotOptimize(c.raw_data());
    if (profile && ++k % 4096 == 0) profiler::clear();
  }
  profiler::enable(false);
  profiler::clear();
}

// The op table's timed cases (opcheck/op_table.h, perf_cases: the shapes above that matter most),
// as "optable/<case>/<backend>": the same runs `duet selftest --mode perf` times, on any backend.
void register_op_table() {
  for (const opcheck::Case& c : opcheck::perf_cases()) {
    for (Backend b : {Backend::cpu}) {
      if (!backend_available(b)) continue;
      const std::string name = "optable/" + c.name + "/" + backend_name(b);
      benchmark::RegisterBenchmark(name.c_str(), [c, b](benchmark::State& st) {
        opcheck::Prepared p(c, opcheck::cpu_target(b));
        p.step();
        const auto [flops, bytes] = p.cost();
        for (auto _ : st) p.step();
        set_counters(st, OpCost{flops, bytes});
      })->UseRealTime()->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace duet

int main(int argc, char** argv) {
  duet::register_all();
  duet::register_op_table();
  benchmark::RegisterBenchmark("dispatch_add16/profiling_off", duet::dispatch_overhead, false)->Unit(benchmark::kNanosecond);
  benchmark::RegisterBenchmark("dispatch_add16/profiling_on", duet::dispatch_overhead, true)->Unit(benchmark::kNanosecond);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
