// torch.nn.init: in-place initialisers. Draws come from the engine's counter-based generator on
// the tensor's own device, then are copied into the tensor, so initialisation is reproducible
// from a seed whatever the backend or thread count.
#include <cmath>
#include "engine/autograd.h"
#include "engine/functional.h"
#include "engine/nn/layers.h"

namespace duet::nn {

namespace {
void check_target(const char* fn, const Tensor& t) {
  DUET_CHECK(t.defined(), "{}: the tensor is undefined", fn);
  DUET_CHECK(is_floating(t.dtype()), "{}: tensor has dtype {}, expected a floating-point dtype", fn,
             dtype_name(t.dtype()));
}

// Draws are made in f32/f64 (what the random kernels produce); f16/bf16 targets get a cast.
TensorOptions draw_options(const Tensor& t) {
  const DType dt = t.dtype() == DType::f64 ? DType::f64 : DType::f32;
  return TensorOptions(dt).with_device(t.device());
}

// The receptive field of a conv weight [O, I, KH, KW] is KH * KW; 1 for a linear weight.
int64_t receptive_field(const char* fn, const Tensor& t) {
  DUET_CHECK(t.defined() && t.dim() >= 2,
             "{}: fan in and fan out need a tensor with at least 2 dims, got shape {}", fn,
             t.defined() ? shape_str(t.shape()) : std::string("undefined"));
  int64_t r = 1;
  for (int64_t d = 2; d < t.dim(); ++d) r *= t.size(d);
  return r;
}
}  // namespace

int64_t fan_in(const Tensor& t) { return t.size(1) * receptive_field("fan_in", t); }
int64_t fan_out(const Tensor& t) { return t.size(0) * receptive_field("fan_out", t); }

void uniform_(const Tensor& t, double lo, double hi, Generator* g) {
  check_target("uniform_", t);
  DUET_CHECK(lo <= hi, "uniform_: lower bound {} is above upper bound {}", lo, hi);
  NoGradGuard no_grad;
  MemTagGuard tag(MemTag::workspace);
  const Tensor u = Tensor::rand(t.shape(), draw_options(t), g);
  t.copy_(add(mul(u, hi - lo), lo));
}

void normal_(const Tensor& t, double mean, double std, Generator* g) {
  check_target("normal_", t);
  DUET_CHECK(std >= 0, "normal_: std must be >= 0, got {}", std);
  NoGradGuard no_grad;
  MemTagGuard tag(MemTag::workspace);
  const Tensor n = Tensor::randn(t.shape(), draw_options(t), g);
  t.copy_(add(mul(n, std), mean));
}

void kaiming_uniform_(const Tensor& t, double a, Generator* g) {
  check_target("kaiming_uniform_", t);
  const double gain = std::sqrt(2.0 / (1.0 + a * a));  // leaky_relu with negative slope a
  const double bound = std::sqrt(3.0) * gain / std::sqrt(static_cast<double>(fan_in(t)));
  uniform_(t, -bound, bound, g);
}

void kaiming_normal_(const Tensor& t, bool use_fan_out, Generator* g) {
  check_target("kaiming_normal_", t);
  const double fan = static_cast<double>(use_fan_out ? fan_out(t) : fan_in(t));
  normal_(t, 0.0, std::sqrt(2.0) / std::sqrt(fan), g);  // relu gain
}

void xavier_uniform_(const Tensor& t, Generator* g) {
  check_target("xavier_uniform_", t);
  const double bound = std::sqrt(6.0 / static_cast<double>(fan_in(t) + fan_out(t)));
  uniform_(t, -bound, bound, g);
}

void trunc_normal_(const Tensor& t, double std, Generator* g) {
  check_target("trunc_normal_", t);
  DUET_CHECK(std > 0, "trunc_normal_: std must be positive, got {}", std);
  // Rejection sampling on the host: values beyond 2 std are redrawn, so the result is the
  // truncated normal (clamping would pile mass on the bounds). About 4.6% of draws are redrawn.
  NoGradGuard no_grad;
  MemTagGuard tag(MemTag::workspace);
  const TensorOptions host(DType::f64);
  std::vector<double> v = Tensor::randn(t.shape(), host, g).to_vector<double>();
  std::vector<size_t> bad;
  for (size_t i = 0; i < v.size(); ++i)
    if (std::abs(v[i]) > 2.0) bad.push_back(i);
  while (!bad.empty()) {
    const std::vector<double> redraw =
        Tensor::randn({static_cast<int64_t>(bad.size())}, host, g).to_vector<double>();
    std::vector<size_t> still;
    for (size_t k = 0; k < bad.size(); ++k) {
      if (std::abs(redraw[k]) > 2.0) still.push_back(bad[k]);
      else v[bad[k]] = redraw[k];
    }
    bad.swap(still);
  }
  for (double& x : v) x *= std;
  t.copy_(Tensor::from_vector(v, t.shape(), host).to(t.device()));
}

}  // namespace duet::nn
