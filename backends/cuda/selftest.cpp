// The CUDA self-test: each case runs through the public front-ends twice, once on the reference
// backend with host tensors and once with the same values moved to the GPU, and the outputs and
// the gradients of sum(out * R) (R random, so every output element matters) are compared.
#include "backends/cuda/selftest.h"
#include <cudnn.h>
#include <cublas_v2.h>
#include <chrono>
#include <cmath>
#include <cuda_runtime_api.h>
#include <random>
#include "backends/cuda/caching_allocator.h"
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/nvml_telemetry.h"
#include "backends/cuda/cuda_backend.h"
#include "engine/duet.h"

namespace duet {

namespace {

// Uniform values in [lo, hi) with a fixed seed.
Tensor rnd(const Shape& shape, uint64_t seed, double lo = -1.0, double hi = 1.0, DType dt = DType::f32) {
  Generator g(seed);
  NoGradGuard no_grad;
  return add(mul(Tensor::rand(shape, TensorOptions(DType::f64), &g), hi - lo), lo).to(dt);
}

Tensor labels(int64_t n, int64_t classes, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(classes));
  return Tensor::from_vector(v, {n});
}

// max |a - b| / (atol + rtol |b|): <= 1 means close. NaN in the same places counts as equal.
double closeness(const Tensor& a, const Tensor& b, double atol, double rtol) {
  if (a.shape() != b.shape()) return INFINITY;
  const std::vector<double> va = a.to_vector<double>(), vb = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) {
      if (!(std::isnan(va[i]) && std::isnan(vb[i]))) return INFINITY;
      continue;
    }
    if (va[i] == vb[i]) continue;  // equal infinities too
    worst = std::max(worst, std::abs(va[i] - vb[i]) / (atol + rtol * std::abs(vb[i])));
  }
  return worst;
}

struct Run {
  Tensor out;                 // on the host
  std::vector<Tensor> grads;  // on the host, one per differentiated input
};

Run run_on(const CudaSelftestCase& c, Device d, const Tensor& r_host) {
  std::vector<Tensor> in;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    Tensor t = d == Device::cpu() ? c.inputs[i].clone() : c.inputs[i].to(d);
    t = t.detach();
    if (i < c.differentiate.size() && c.differentiate[i]) t.set_requires_grad(true);
    in.push_back(t);
  }
  Run r;
  Tensor out = c.fn(in);
  if (r_host.defined() && out.requires_grad()) {
    sum(mul(out, r_host.to(out.dtype()).to(d))).backward();
    for (size_t i = 0; i < in.size(); ++i)
      if (i < c.differentiate.size() && c.differentiate[i])
        r.grads.push_back(in[i].grad().defined() ? in[i].grad().to(Device::cpu()) : Tensor::zeros_like(c.inputs[i]));
  }
  r.out = out.detach().to(Device::cpu());
  return r;
}

bool any_grad(const CudaSelftestCase& c) {
  for (bool b : c.differentiate)
    if (b) return true;
  return false;
}

}  // namespace

CudaSelftestResult run_cuda_selftest_case(const CudaSelftestCase& c, int device) {
  CudaSelftestResult res;
  res.name = c.name;
  for (const Tensor& t : c.inputs) {
    if (!res.shapes.empty()) res.shapes += ' ';
    res.shapes += shape_str(t.shape());
  }
  try {
    Run ref;
    Tensor r;
    {
      BackendGuard guard(DeviceType::cpu, Backend::reference);
      Tensor probe = c.fn([&] {
        std::vector<Tensor> v;
        for (const Tensor& t : c.inputs) v.push_back(t.clone());
        return v;
      }());
      if (any_grad(c) && is_floating(probe.dtype())) r = rnd(probe.shape(), 99, -1.0, 1.0, DType::f64);
      ref = run_on(c, Device::cpu(), r);
    }
    BackendImpl& cuda = backend(Backend::cuda);
    cuda.synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    Run got = run_on(c, Device::cuda(device), r);
    cuda.synchronize();
    res.cuda_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    res.forward_error = closeness(got.out, ref.out, c.atol, c.rtol);
    for (size_t i = 0; i < ref.grads.size() && i < got.grads.size(); ++i)
      res.backward_error = std::max(res.backward_error, closeness(got.grads[i], ref.grads[i], c.atol, c.rtol));
    if (got.grads.size() != ref.grads.size()) res.backward_error = INFINITY;
    res.passed = res.forward_error <= 1.0 && res.backward_error <= 1.0;
  } catch (const std::exception& e) {
    res.error = e.what();
    res.passed = false;
  }
  return res;
}

std::vector<CudaSelftestCase> cuda_selftest_cases(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1)); };
  uint64_t s = seed * 1000;
  auto next = [&] { return ++s; };
  std::vector<CudaSelftestCase> cs;
  auto add_case = [&](std::string name, std::vector<Tensor> in, std::vector<bool> diff,
                      std::function<Tensor(const std::vector<Tensor>&)> fn, double atol = 1e-5, double rtol = 1e-4) {
    cs.push_back({std::move(name), std::move(in), std::move(diff), std::move(fn), atol, rtol});
  };
  const int64_t a = pick(2, 9), b = pick(3, 17), c = pick(5, 33);

  // -- elementwise --
  add_case("add (broadcast)", {rnd({a, b, c}, next()), rnd({b, 1}, next())}, {true, true},
           [](const auto& v) { return add(v[0], v[1]); });
  add_case("sub (transposed operand)", {rnd({b, a}, next()), rnd({a, b}, next())}, {true, true},
           [](const auto& v) { return sub(v[0].transpose(0, 1), v[1]); });
  add_case("mul", {rnd({a, b, c}, next()), rnd({a, 1, c}, next())}, {true, true}, [](const auto& v) { return mul(v[0], v[1]); });
  add_case("div", {rnd({a, c}, next()), rnd({c}, next(), 0.5, 2.0)}, {true, true}, [](const auto& v) { return div(v[0], v[1]); });
  add_case("maximum/minimum", {rnd({a, c}, next()), rnd({a, c}, next())}, {true, true},
           [](const auto& v) { return add(maximum(v[0], v[1]), minimum(v[0], v[1])); });
  add_case("eq/gt/lt", {rnd({a, c}, next()), rnd({a, c}, next())}, {false, false},
           [](const auto& v) { return add(add(gt(v[0], v[1]), lt(v[0], v[1])), eq(v[0], v[0])); });
  add_case("unary exp/tanh/abs/neg/square", {rnd({a, b, c}, next())}, {true},
           [](const auto& v) { return add(add(exp(v[0]), tanh(v[0])), add(abs(v[0]), square(neg(v[0])))); });
  add_case("unary log/sqrt/rsqrt", {rnd({b, c}, next(), 0.5, 3.0)}, {true},
           [](const auto& v) { return add(log(v[0]), add(sqrt(v[0]), rsqrt(v[0]))); });
  add_case("scalar ops", {rnd({b, c}, next(), 0.5, 2.0)}, {true}, [](const auto& v) {
    return add(add(pow(v[0], 3.0), rdiv(v[0], 2.0)), add(rsub(mul(add(v[0], 1.0), 3.0), 1.0), clamp_min(clamp_max(v[0], 1.5), 0.7)));
  });
  for (Activation act : all_activations())
    add_case(activation_name(act), {rnd({a, b, c}, next(), -8.0, 8.0)}, {true},
             [act](const auto& v) { return activation(act, v[0]); });
  add_case("relu (channels-last)", {rnd({2, b, 5, 6}, next())}, {true},
           [](const auto& v) { return relu(v[0].contiguous(MemoryFormat::channels_last)); });

  // -- reductions --
  add_case("sum dims {0, 2}", {rnd({a, b, c}, next())}, {true}, [](const auto& v) { return sum(v[0], {0, 2}); }, 1e-5, 1e-4);
  add_case("mean all", {rnd({a, b, c}, next())}, {true}, [](const auto& v) { return mean(v[0]); });
  add_case("mean (permuted input)", {rnd({a, b, c}, next())}, {true},
           [](const auto& v) { return mean(v[0].permute({2, 0, 1}), {1}); });
  add_case("amax/amin dim 1", {rnd({a, b, c}, next())}, {true}, [](const auto& v) { return add(amax(v[0], {1}), amin(v[0], {1})); });
  add_case("amin dims {0, 2} keepdim", {rnd({a, b, c}, next())}, {true}, [](const auto& v) { return amin(v[0], {0, 2}, true); });
  add_case("sum f64 (large)", {rnd({300, 257}, next(), -1, 1, DType::f64)}, {true}, [](const auto& v) { return sum(v[0], {0}); },
           1e-10, 1e-10);
  add_case("argmax", {rnd({a, b, c}, next())}, {false}, [](const auto& v) { return argmax(v[0], 1); }, 0.5, 0);

  // -- linear algebra --
  const int64_t M = pick(3, 40), K = pick(3, 70), N = pick(3, 50), B = pick(2, 4);
  add_case("matmul (batched)", {rnd({B, M, K}, next()), rnd({B, K, N}, next())}, {true, true},
           [](const auto& v) { return matmul(v[0], v[1]); }, 1e-4, 1e-4);
  add_case("matmul (broadcast, transposed)", {rnd({K, M}, next()), rnd({B, N, K}, next())}, {true, true},
           [](const auto& v) { return matmul(v[0].transpose(0, 1), v[1].transpose(-1, -2)); }, 1e-4, 1e-4);
  add_case("matmul f64", {rnd({M, K}, next(), -1, 1, DType::f64), rnd({K, N}, next(), -1, 1, DType::f64)}, {true, true},
           [](const auto& v) { return matmul(v[0], v[1]); }, 1e-12, 1e-10);
  add_case("linear (+bias, 3-D input)", {rnd({B, M, K}, next()), rnd({N, K}, next()), rnd({N}, next())}, {true, true, true},
           [](const auto& v) { return linear(v[0], v[1], v[2]); }, 1e-4, 1e-4);

  // -- convolution --
  const int64_t Cin = pick(2, 8) * 2, Cout = pick(2, 8) * 2, H = pick(5, 17), W = pick(5, 17);
  auto conv_case = [&](std::string name, int64_t groups, Conv2dParams p, int64_t k, bool nhwc, DType dt, double atol,
                       double rtol) {
    p.groups = groups;
    add_case(std::move(name),
             {rnd({2, Cin, H, W}, next(), -1, 1, dt), rnd({Cout, Cin / groups, k, k}, next(), -1, 1, dt), rnd({Cout}, next(), -1, 1, dt)},
             {true, true, true},
             [p, nhwc](const auto& v) {
               return conv2d(nhwc ? v[0].contiguous(MemoryFormat::channels_last) : v[0], v[1], v[2], p);
             },
             atol, rtol);
  };
  conv_case("conv2d 3x3 pad 1", 1, {1, 1, 1, 1, 1, 1, 1}, 3, false, DType::f32, 1e-4, 1e-3);
  conv_case("conv2d 3x3 stride 2 (channels-last)", 1, {2, 2, 1, 1, 1, 1, 1}, 3, true, DType::f32, 1e-4, 1e-3);
  conv_case("conv2d groups 2, dilation 2", 2, {1, 1, 2, 2, 2, 2, 1}, 3, false, DType::f32, 1e-4, 1e-3);
  conv_case("conv2d 1x1 (channels-last)", 1, {1, 1, 0, 0, 1, 1, 1}, 1, true, DType::f32, 1e-4, 1e-3);
  conv_case("conv2d f64", 1, {1, 1, 1, 1, 1, 1, 1}, 3, false, DType::f64, 1e-11, 1e-9);
  conv_case("conv2d + bias + ReLU fused (channels-last)", 1, {1, 1, 1, 1, 1, 1, 1, true}, 3, true, DType::f32, 1e-4, 1e-3);
  // TF32 tensor cores: a 10-bit mantissa, so about 1e-3 relative (PyTorch's allow_tf32 tolerance)
  add_case("conv2d with TF32 allowed", {rnd({2, Cin, H, W}, next()), rnd({Cout, Cin, 3, 3}, next())}, {true, true},
           [](const auto& v) {
             const bool before = cuda_allow_tf32();
             cuda_set_allow_tf32(true);
             Tensor y = conv2d(v[0], v[1], Tensor(), {1, 1, 1, 1, 1, 1, 1});
             cuda_set_allow_tf32(before);
             return y;
           },
           5e-3, 5e-3);

  // -- mixed precision: autocast sends 16-bit operands to cuDNN/cuBLAS and the reference loops;
  // both accumulate in f32 and round once, so they differ by about an ulp of the 16-bit type --
  auto autocast_case = [&](std::string name, DType low, std::vector<Tensor> in,
                           std::function<Tensor(const std::vector<Tensor>&)> fn) {
    const double tol = low == DType::bf16 ? 2e-2 : 4e-3;
    std::vector<bool> diff(in.size(), true);
    add_case(std::move(name), std::move(in), std::move(diff),
             [low, fn](const std::vector<Tensor>& v) {
               AutocastGuard amp(low);
               return fn(v);
             },
             tol, tol);
  };
  autocast_case("conv2d bf16 autocast (channels-last)", DType::bf16,
                {rnd({2, Cin, H, W}, next()), rnd({Cout, Cin, 3, 3}, next()), rnd({Cout}, next())},
                [](const auto& v) { return conv2d(v[0].contiguous(MemoryFormat::channels_last), v[1], v[2], {1, 1, 1, 1, 1, 1, 1}); });
  autocast_case("conv2d f16 autocast (groups 2)", DType::f16,
                {rnd({2, Cin, H, W}, next()), rnd({Cout, Cin / 2, 3, 3}, next()), rnd({Cout}, next())},
                [](const auto& v) { return conv2d(v[0], v[1], v[2], {2, 2, 1, 1, 1, 1, 2}); });
  autocast_case("matmul bf16 autocast (broadcast, transposed)", DType::bf16, {rnd({K, M}, next()), rnd({B, N, K}, next())},
                [](const auto& v) { return matmul(v[0].transpose(0, 1), v[1].transpose(-1, -2)); });
  autocast_case("linear f16 autocast (+bias)", DType::f16, {rnd({B, M, K}, next()), rnd({N, K}, next()), rnd({N}, next())},
                [](const auto& v) { return linear(v[0], v[1], v[2]); });

  // -- normalisation --
  add_case("batch_norm train", {rnd({4, Cin, 6, 5}, next()), rnd({Cin}, next()), rnd({Cin}, next())}, {true, true, true},
           [](const auto& v) {
             const TensorOptions o = TensorOptions().with_device(v[0].device());
             return batch_norm(v[0], v[1], v[2], Tensor::zeros({v[0].size(1)}, o), Tensor::ones({v[0].size(1)}, o), {});
           }, 1e-4, 1e-3);
  add_case("batch_norm train (channels-last)", {rnd({4, Cin, 6, 5}, next()), rnd({Cin}, next()), rnd({Cin}, next())},
           {true, true, true}, [](const auto& v) {
             const TensorOptions o = TensorOptions().with_device(v[0].device());
             return batch_norm(v[0].contiguous(MemoryFormat::channels_last), v[1], v[2], Tensor::zeros({v[0].size(1)}, o),
                               Tensor::ones({v[0].size(1)}, o), {});
           }, 1e-4, 1e-3);
  add_case("batch_norm + ReLU fused (channels-last)", {rnd({4, Cin, 6, 5}, next()), rnd({Cin}, next()), rnd({Cin}, next())},
           {true, true, true}, [](const auto& v) {
             const TensorOptions o = TensorOptions().with_device(v[0].device());
             BatchNormParams p;
             p.relu = true;
             return batch_norm(v[0].contiguous(MemoryFormat::channels_last), v[1], v[2], Tensor::zeros({v[0].size(1)}, o),
                               Tensor::ones({v[0].size(1)}, o), p);
           }, 1e-4, 1e-3);
  add_case("batch_norm running stats", {rnd({8, Cin}, next(), 0, 3)}, {false}, [](const auto& v) {
    const TensorOptions o = TensorOptions().with_device(v[0].device());
    const int64_t C = v[0].size(1);
    Tensor rm = Tensor::zeros({C}, o), rv = Tensor::ones({C}, o);
    batch_norm(v[0], Tensor::ones({C}, o), Tensor::zeros({C}, o), rm, rv, {true, 0.3, 1e-5});
    return cat({rm, rv}, 0);
  }, 1e-5, 1e-4);
  add_case("batch_norm eval", {rnd({3, Cin, 4, 4}, next()), rnd({Cin}, next()), rnd({Cin}, next()), rnd({Cin}, next()),
                               rnd({Cin}, next(), 0.5, 2.0)},
           {true, true, true, false, false},
           [](const auto& v) { return batch_norm(v[0], v[1], v[2], v[3], v[4], {false, 0.1, 1e-5}); }, 1e-5, 1e-4);
  add_case("layer_norm", {rnd({a * b, c * 4}, next()), rnd({c * 4}, next()), rnd({c * 4}, next())}, {true, true, true},
           [](const auto& v) { return layer_norm(v[0], v[1], v[2]); }, 1e-4, 1e-3);
  add_case("layer_norm (no affine, f64)", {rnd({a, b, 700}, next(), -1, 1, DType::f64)}, {true},
           [](const auto& v) { return layer_norm(v[0], Tensor(), Tensor()); }, 1e-10, 1e-8);

  // -- pooling --
  auto pool_case = [&](std::string name, bool max, Pool2dParams p, bool nhwc) {
    add_case(std::move(name), {rnd({2, 3, H, W}, next())}, {true}, [=](const auto& v) {
      const Tensor x = nhwc ? v[0].contiguous(MemoryFormat::channels_last) : v[0];
      return max ? max_pool2d(x, p) : avg_pool2d(x, p);
    });
  };
  pool_case("max_pool2d 3x3 s2 p1", true, {3, 3, 2, 2, 1, 1, true, false}, false);
  pool_case("max_pool2d 2x2 (channels-last)", true, {2, 2, 2, 2, 0, 0, true, false}, true);
  pool_case("max_pool2d 3x3 s2 ceil", true, {3, 3, 2, 2, 0, 0, true, true}, false);
  pool_case("avg_pool2d 3x3 s2 p1 include pad", false, {3, 3, 2, 2, 1, 1, true, false}, false);
  pool_case("avg_pool2d 3x3 s2 p1 exclude pad", false, {3, 3, 2, 2, 1, 1, false, false}, true);
  pool_case("avg_pool2d 3x3 s2 p1 ceil", false, {3, 3, 2, 2, 1, 1, true, true}, false);
  add_case("adaptive_avg_pool2d 3x4", {rnd({2, 3, H, W}, next())}, {true},
           [](const auto& v) { return adaptive_avg_pool2d(v[0], 3, 4); });
  add_case("adaptive_avg_pool2d global (channels-last)", {rnd({2, 5, H, W}, next())}, {true},
           [](const auto& v) { return adaptive_avg_pool2d(v[0].contiguous(MemoryFormat::channels_last), 1, 1); });

  // -- softmax and losses --
  add_case("softmax dim 1", {rnd({a, b, c}, next(), -4, 4)}, {true}, [](const auto& v) { return softmax(v[0], 1); });
  add_case("log_softmax dim -1", {rnd({a, b * 10}, next(), -4, 4)}, {true}, [](const auto& v) { return log_softmax(v[0], -1); });
  add_case("softmax f64", {rnd({a, c}, next(), -4, 4, DType::f64)}, {true}, [](const auto& v) { return softmax(v[0], 0); },
           1e-12, 1e-10);
  const int64_t classes = pick(2, 300), rows = pick(1, 64);
  add_case("cross_entropy", {rnd({rows, classes}, next(), -3, 3), labels(rows, classes, next())}, {true, false},
           [](const auto& v) { return cross_entropy(v[0], v[1]); });
  add_case("cross_entropy label smoothing 0.1", {rnd({rows, classes}, next(), -3, 3), labels(rows, classes, next())},
           {true, false}, [](const auto& v) { return cross_entropy(v[0], v[1], 0.1); });

  // -- random numbers (same generator state: same uniform bits as the CPU) --
  add_case("dropout p=0.3", {rnd({a, b, c}, next())}, {true}, [](const auto& v) {
    Generator g(1234);
    return dropout(v[0], 0.3, true, &g);
  }, 0, 0);
  add_case("rand", {rnd({1}, next())}, {false}, [](const auto& v) {
    Generator g(77);
    return Tensor::rand({1000}, TensorOptions().with_device(v[0].device()), &g);
  }, 0, 0);
  add_case("randn f32", {rnd({1}, next())}, {false}, [](const auto& v) {
    Generator g(79);
    return Tensor::randn({1000}, TensorOptions(DType::f32).with_device(v[0].device()), &g);
  }, 1e-6, 1e-5);
  // Large enough that every grid-stride loop makes several passes (more elements than threads launched).
  add_case("relu + sum, 2^23 elements", {rnd({1 << 13, 1 << 10}, next())}, {true},
           [](const auto& v) { return sum(relu(v[0]), {0}); }, 1e-3, 1e-4);
  add_case("randn", {rnd({1}, next())}, {false}, [](const auto& v) {
    Generator g(78);
    return Tensor::randn({1000}, TensorOptions(DType::f64).with_device(v[0].device()), &g);
  }, 1e-12, 1e-12);

  // -- memory --
  add_case("cat (non-contiguous inputs)", {rnd({b, a}, next()), rnd({a, c}, next())}, {true, true},
           [](const auto& v) { return cat({v[0].transpose(0, 1), v[1]}, 1); });
  add_case("cat (channels-last, along channels)", {rnd({2, b, 5, 6}, next()), rnd({2, c, 5, 6}, next())}, {true, true},
           [](const auto& v) {
             return cat({v[0].contiguous(MemoryFormat::channels_last), v[1].contiguous(MemoryFormat::channels_last)}, 1);
           });
  add_case("permute + contiguous", {rnd({a, b, c}, next())}, {true}, [](const auto& v) { return v[0].permute({2, 0, 1}).contiguous(); });
  add_case("expand + contiguous", {rnd({1, c}, next())}, {true}, [a](const auto& v) { return v[0].expand({a, -1}).contiguous(); });
  add_case("casts f32 -> f64 -> i32 -> f32", {rnd({a, c}, next(), -50, 50)}, {false},
           [](const auto& v) { return v[0].to(DType::f64).to(DType::i32).to(DType::f32); }, 0, 0);
  add_case("slice with step", {rnd({a, 4 * c}, next())}, {true}, [](const auto& v) { return mul(v[0].slice(1, 1, -1, 3), 2.0); });

  // -- optimizers --
  add_case("sgd_step (momentum, nesterov, wd)", {rnd({a, c}, next()), rnd({a, c}, next())}, {false, false}, [](const auto& v) {
    Tensor w = v[0].clone(), buf = Tensor::zeros_like(v[0]);
    const SgdParams p{0.1, 0.9, 0.0, 1e-4, true};
    sgd_step_(w, v[1], buf, p, true);
    sgd_step_(w, v[1], buf, p, false);
    return w;
  });
  add_case("adam_step (L2 weight decay)", {rnd({a, c}, next()), rnd({a, c}, next())}, {false, false}, [](const auto& v) {
    Tensor w = v[0].clone(), m = Tensor::zeros_like(v[0]), s2 = Tensor::zeros_like(v[0]);
    AdamParams p;
    p.weight_decay = 1e-2;  // folded into the gradient (decoupled = false)
    adam_step_(w, v[1], m, s2, p);
    p.step = 2;
    adam_step_(w, v[1], m, s2, p);
    return w;
  });
  add_case("adamw_step", {rnd({a, c}, next()), rnd({a, c}, next())}, {false, false}, [](const auto& v) {
    Tensor w = v[0].clone(), m = Tensor::zeros_like(v[0]), s2 = Tensor::zeros_like(v[0]);
    AdamParams p;
    p.weight_decay = 0.01;
    p.decoupled = true;
    adam_step_(w, v[1], m, s2, p);
    p.step = 2;
    adam_step_(w, v[1], m, s2, p);
    return w;
  });
  return cs;
}

int cuda_selftest(std::ostream& os, uint64_t seed) {
  if (cuda_device_count() == 0) {
    os << "cuda selftest: " << cuda::unavailable_reason() << "\n";
    return 2;
  }
  cudaDeviceProp prop{};
  int driver = 0, runtime = 0;
  (void)cuda::handled(cudaGetDeviceProperties(&prop, 0));
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  int cublas_version = 0;
  (void)cublasGetProperty(MAJOR_VERSION, &cublas_version);
  os << fmt::format("device cuda:0 {} (sm_{}{}, {}), driver {}.{}, runtime {}.{}, cuDNN {}, cuBLAS {}.x, TF32 {}\n", prop.name,
                    prop.major, prop.minor, cuda::format_bytes(double(prop.totalGlobalMem)), driver / 1000,
                    (driver % 1000) / 10, runtime / 1000, (runtime % 1000) / 10, cudnnGetVersion(), cublas_version,
                    cuda_allow_tf32() ? "on" : "off");
  os << cuda::format_telemetry(cuda::sample_telemetry(0)) << "\n";
  os << fmt::format("{:<44} {:<40} {:>10} {:>10} {:>9}  {}\n", "op", "inputs", "fwd err", "bwd err", "ms", "result");
  int failed = 0, total = 0;
  for (const CudaSelftestCase& c : cuda_selftest_cases(seed)) {
    const CudaSelftestResult r = run_cuda_selftest_case(c);
    ++total;
    if (!r.passed) ++failed;
    std::string shapes = r.shapes.size() > 40 ? r.shapes.substr(0, 37) + "..." : r.shapes;
    os << fmt::format("{:<44} {:<40} {:>10.3g} {:>10.3g} {:>9.3f}  {}\n", r.name, shapes, r.forward_error, r.backward_error,
                      r.cuda_ms, r.passed ? "ok" : "FAIL");
    if (!r.error.empty()) os << "    error: " << r.error << "\n";
  }
  const cuda::CachingStats cs = cuda::allocator(0).caching_stats();
  os << fmt::format("{} of {} cases passed (errors are max |cuda - ref| / (atol + rtol |ref|); <= 1 passes)\n", total - failed,
                    total);
  os << fmt::format("allocator: {} reserved, {} cached, {} cudaMalloc calls, {} cache hits\n",
                    cuda::format_bytes(double(cs.reserved)), cuda::format_bytes(double(cs.cached)), cs.source_allocs,
                    cs.cache_hits);
  return failed == 0 ? 0 : 1;
}

}  // namespace duet
