#include "engine/nn/conv_bn.h"
#include <array>
#include <cstring>
#include <string_view>
#include "engine/autograd.h"
#include "engine/frozen_copies.h"
#include "engine/profiler/events.h"

namespace duet::nn {

namespace {

std::array<const Tensor*, 6> folded_from(const Conv2d& conv, const BatchNorm2d& bn) {
  return {&conv.weight, &conv.bias, &bn.weight, &bn.bias, &bn.running_mean, &bn.running_var};
}

// The key part that names what a folded copy was computed from: each source's storage and freeze,
// as raw bytes in a buffer on the stack (it is built for every layer of every inference forward, so
// nothing is formatted or allocated).
class FoldSources {
public:
  FoldSources(const Conv2d& conv, const BatchNorm2d& bn, std::string_view part) {
    append(kPrefix.data(), kPrefix.size());
    DUET_CHECK(part.size() <= kPartMax, "FoldSources: part name '{}' is longer than {} characters", part, kPartMax);
    append(part.data(), part.size());
    for (const Tensor* t : folded_from(conv, bn))
      for (const uint64_t v : {t->defined() ? t->storage()->id : 0, t->defined() ? t->freeze_number() : 0})
        append(&v, sizeof v);
  }
  std::string_view view() const { return {bytes_.data(), size_}; }

private:
  static constexpr std::string_view kPrefix = "folded batch norm ";
  static constexpr size_t kPartMax = 16;
  void append(const void* p, size_t n) {
    std::memcpy(bytes_.data() + size_, p, n);
    size_ += n;
  }
  std::array<char, kPrefix.size() + kPartMax + 6 * 2 * sizeof(uint64_t)> bytes_;
  size_t size_ = 0;
};

// s = gamma / sqrt(var + eps) per output channel, in f64 whatever the parameters' dtype, so the
// folded weights are rounded once.
Tensor fold_scale(const BatchNorm2d& bn) {
  return mul(bn.weight.to(DType::f64), rsqrt(add(bn.running_var.to(DType::f64), bn.eps)));
}

struct Folded {
  Tensor weight, bias;
};

Folded folded(const Conv2d& conv, const BatchNorm2d& bn) {
  const Tensor& w = conv.weight;
  const Tensor weight = frozen_copy(w, FoldSources(conv, bn, "weight").view(), [&] {
    const int64_t O = w.size(0);
    const Tensor f = mul(w.to(DType::f64), fold_scale(bn).view({O, 1, 1, 1}))
                         .to(w.dtype())
                         .contiguous(w.suggest_memory_format());
    f.freeze();
    return f;
  });
  const Tensor bias = frozen_copy(w, FoldSources(conv, bn, "bias").view(), [&] {
    const Tensor mean = bn.running_mean.to(DType::f64);
    const Tensor shift = conv.bias.defined() ? sub(conv.bias.to(DType::f64), mean) : mul(mean, -1.0);
    const Tensor b = add(bn.bias.to(DType::f64), mul(shift, fold_scale(bn))).to(w.dtype());
    b.freeze();
    return b;
  });
  return {weight, bias};
}

}  // namespace

bool folds_batch_norm(const Conv2d& conv, const BatchNorm2d& bn) {
  if (bn.is_training() || bn.sum_over_replicas) return false;
  for (const Tensor* t : folded_from(conv, bn))
    if (t->defined() && (!t->is_frozen() || (grad_mode_enabled() && t->requires_grad()))) return false;
  return bn.running_mean.defined() && bn.running_var.defined() && conv.weight.size(0) == bn.weight.size(0);
}

Tensor conv_bn(Conv2d& conv, BatchNorm2d& bn, const Tensor& x, std::optional<Activation> act, const Tensor& residual) {
  if (!folds_batch_norm(conv, bn)) {
    const Tensor y = conv(x);
    if (residual.defined()) return bn.forward_add(y, residual, act);
    return act ? bn.forward_act(y, *act) : bn(y);
  }
  // One op in the profile, attributed to the convolution's layer (the batch norm's has no op left).
  std::optional<profiler::ScopeGuard> scope;
  if (profiler::enabled()) scope.emplace(conv.name());
  const Folded f = folded(conv, bn);
  Conv2dParams p = conv.params;
  p.act = act;
  return conv2d(x, f.weight, f.bias, p, residual);
}

}  // namespace duet::nn
