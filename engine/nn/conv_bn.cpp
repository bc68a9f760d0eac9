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

// Each source's storage and freeze: what a folded copy was computed from.
using Sources = std::array<uint64_t, 12>;
Sources sources_of(const Conv2d& conv, const BatchNorm2d& bn) {
  Sources s{};
  size_t i = 0;
  for (const Tensor* t : folded_from(conv, bn)) {
    s[i++] = t->defined() ? t->storage()->id : 0;
    s[i++] = t->defined() ? t->freeze_number() : 0;
  }
  return s;
}

// The key part that names what a folded copy was computed from: the sources as raw bytes in a
// buffer on the stack (nothing is formatted or allocated).
class FoldSources {
public:
  FoldSources(const Sources& sources, std::string_view part) {
    append(kPrefix.data(), kPrefix.size());
    DUET_CHECK(part.size() <= kPartMax, "FoldSources: part name '{}' is longer than {} characters", part, kPartMax);
    append(part.data(), part.size());
    append(sources.data(), sizeof sources);
  }
  std::string_view view() const { return {bytes_.data(), size_}; }

private:
  static constexpr std::string_view kPrefix = "folded batch norm ";
  static constexpr size_t kPartMax = 16;
  void append(const void* p, size_t n) {
    std::memcpy(bytes_.data() + size_, p, n);
    size_ += n;
  }
  std::array<char, kPrefix.size() + kPartMax + sizeof(Sources)> bytes_;
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

Folded folded(const Conv2d& conv, const BatchNorm2d& bn, const Sources& sources) {
  const Tensor& w = conv.weight;
  const Tensor weight = frozen_copy(w, FoldSources(sources, "weight").view(), [&] {
    const int64_t O = w.size(0);
    const Tensor f = mul(w.to(DType::f64), fold_scale(bn).view({O, 1, 1, 1}))
                         .to(w.dtype())
                         .contiguous(w.suggest_memory_format());
    f.freeze();
    return f;
  });
  const Tensor bias = frozen_copy(w, FoldSources(sources, "bias").view(), [&] {
    const Tensor mean = bn.running_mean.to(DType::f64);
    const Tensor shift = conv.bias.defined() ? sub(conv.bias.to(DType::f64), mean) : mul(mean, -1.0);
    const Tensor b = add(bn.bias.to(DType::f64), mul(shift, fold_scale(bn))).to(w.dtype());
    b.freeze();
    return b;
  });
  return {weight, bias};
}

// The folded copies, from the layer's memo when it holds those of the same sources (two lookups in
// the kept copies' map, their keys hashed and compared, were 5-7% of a MobileNetV2 inference pass
// for one image), else from the map, then remembered.
Folded folded_remembered(Conv2d& conv, const BatchNorm2d& bn) {
  const Sources sources = sources_of(conv, bn);
  Conv2d::FoldedMemo& memo = *conv.folded_memo;
  {
    std::lock_guard<std::mutex> lock(memo.mu);
    if (memo.weight.defined() && memo.sources == sources) return {memo.weight, memo.bias};
  }
  const Folded f = folded(conv, bn, sources);
  std::lock_guard<std::mutex> lock(memo.mu);
  memo.sources = sources;
  memo.weight = f.weight;
  memo.bias = f.bias;
  return f;
}

// Forgets the memo (the layer runs unfolded now: trained, or not frozen), so it keeps no copy alive.
void forget_folded(Conv2d& conv) {
  Conv2d::FoldedMemo& memo = *conv.folded_memo;
  std::lock_guard<std::mutex> lock(memo.mu);
  memo.weight = Tensor();
  memo.bias = Tensor();
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
    forget_folded(conv);
    const Tensor y = conv(x);
    if (residual.defined()) return bn.forward_add(y, residual, act);
    return act ? bn.forward_act(y, *act) : bn(y);
  }
  // One op in the profile, attributed to the convolution's layer (the batch norm's has no op left).
  std::optional<profiler::ScopeGuard> scope;
  if (profiler::enabled()) scope.emplace(conv.name());
  const Folded f = folded_remembered(conv, bn);
  Conv2dParams p = conv.params;
  p.act = act;
  return conv2d(x, f.weight, f.bias, p, residual);
}

}  // namespace duet::nn
