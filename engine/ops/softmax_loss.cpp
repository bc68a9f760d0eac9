// Front-ends of softmax, log-softmax, cross-entropy and dropout.
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
Tensor softmax_impl(const Tensor& x_in, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_float_or_half(name, "input", x_in);
  dim = wrap_dim(dim, x_in.dim(), name);
  const Tensor x = untracked(x_in).contiguous();
  Tensor y;
  {
    Dispatch<OpId::softmax> kernel(backend_of(x), {&x});
    y = Tensor::empty(x.shape(), TensorOptions(x.dtype()).with_device(x.device()));
    kernel(x, y, dim, log);
  }
  if (should_record({&x_in})) {
    const Tensor yd = y.detach();
    record(name, {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = gs[0].contiguous();
      Dispatch<OpId::softmax_backward> kernel(backend_of(dy), {&yd, &dy});
      Tensor dx = Tensor::empty(yd.shape(), TensorOptions(yd.dtype()).with_device(yd.device()));
      kernel(yd, dy, dx, dim, log);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target_in, double label_smoothing) {
  check_float_or_half("cross_entropy", "logits", logits_in);
  // The loss of 16-bit logits (a mixed-precision network's head) is computed in f32, as autocast
  // does in PyTorch: a log-sum-exp over the classes, where bf16 would lose the small terms.
  if (is_half(logits_in.dtype())) return cross_entropy(logits_in.to(DType::f32), target_in, label_smoothing);
  check_dim("cross_entropy", "logits", logits_in, 2);
  check_dtype("cross_entropy", "target", target_in, DType::i64);
  check_dim("cross_entropy", "target", target_in, 1);
  DUET_CHECK(target_in.device() == logits_in.device(), "cross_entropy: target is on {}, logits on {}: expected one device",
             target_in.device().str(), logits_in.device().str());
  DUET_CHECK(target_in.size(0) == logits_in.size(0),
             "cross_entropy: logits have batch size {} but target has {} labels: expected one label per row",
             logits_in.size(0), target_in.size(0));
  DUET_CHECK(logits_in.size(0) > 0, "cross_entropy: empty batch (logits shape {})", shape_str(logits_in.shape()));
  DUET_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0,
             "cross_entropy: label_smoothing must be in [0, 1], got {}", label_smoothing);
  const Tensor logits = untracked(logits_in).contiguous();
  const Tensor target = target_in.contiguous();
  Tensor loss;
  {
    Dispatch<OpId::cross_entropy> kernel(backend_of(logits), {&logits, &target});
    loss = Tensor::empty({}, TensorOptions(logits.dtype()).with_device(logits.device()));
    kernel(logits, target, loss, label_smoothing);
  }
  if (should_record({&logits_in})) {
    record("cross_entropy", {&logits_in}, {&loss}, [=](const std::vector<Tensor>& gs) {
      const Tensor dloss = gs[0].contiguous();
      Dispatch<OpId::cross_entropy_backward> kernel(backend_of(logits), {&logits, &target});
      Tensor dlogits = Tensor::empty(logits.shape(), TensorOptions(logits.dtype()).with_device(logits.device()));
      kernel(logits, target, dloss, dlogits, label_smoothing);
      return std::vector<Tensor>{dlogits};
    });
  }
  return loss;
}

Tensor dropout(const Tensor& x_in, double p, bool training, Generator* g) {
  check_float_or_half("dropout", "input", x_in);
  DUET_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x_in;
  const Tensor x = dense(untracked(x_in));
  Generator& gen = g ? *g : default_generator();
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(x.numel()));
  Tensor y, mask;
  {
    Dispatch<OpId::dropout> kernel(backend_of(x), {&x});
    y = empty_like_layout(x, x.shape());
    mask = empty_like_layout(x, x.shape());
    kernel(x, y, mask, p, gen.seed, offset);
  }
  if (should_record({&x_in})) {
    record("dropout", {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      return std::vector<Tensor>{mul(gs[0], mask)};
    });
  }
  return y;
}

}  // namespace duet
