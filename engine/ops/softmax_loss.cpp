// Front-ends of softmax, log-softmax, cross-entropy and dropout.
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {
Tensor softmax_impl(const Tensor& x_in, int64_t dim, bool log) {
  const char* name = log ? "log_softmax" : "softmax";
  check_float(name, "input", x_in);
  dim = wrap_dim(dim, x_in.dim(), name);
  const Tensor x = x_in.detach().contiguous();
  BackendImpl& be = backend_of(x);
  const size_t elem = dtype_size(x.dtype());
  Tensor y;
  {
    profiler::OpScope scope(name, be.kind(), {&x}, [&] { return cost::softmax(x.shape(), elem); });
    y = Tensor::empty(x.shape(), TensorOptions(x.dtype()).with_device(x.device()));
    be.softmax(x, y, dim, log);
  }
  if (should_record({&x_in})) {
    const Tensor yd = y.detach();
    record(name, {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = gs[0].contiguous();
      BackendImpl& b = backend_of(dy);
      profiler::OpScope scope(log ? "log_softmax.backward" : "softmax.backward", b.kind(), {&yd, &dy},
                              [&] { return cost::softmax(yd.shape(), elem); });
      Tensor dx = Tensor::empty(yd.shape(), TensorOptions(yd.dtype()).with_device(yd.device()));
      b.softmax_backward(yd, dy, dx, dim, log);
      return std::vector<Tensor>{dx};
    });
  }
  return y;
}
}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target_in, double label_smoothing) {
  check_float("cross_entropy", "logits", logits_in);
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
  const Tensor logits = logits_in.detach().contiguous();
  const Tensor target = target_in.contiguous();
  BackendImpl& be = backend_of(logits);
  const size_t elem = dtype_size(logits.dtype());
  Tensor loss;
  {
    profiler::OpScope scope("cross_entropy", be.kind(), {&logits, &target}, [&] { return cost::cross_entropy(logits.shape(), elem); });
    loss = Tensor::empty({}, TensorOptions(logits.dtype()).with_device(logits.device()));
    be.cross_entropy(logits, target, loss, label_smoothing);
  }
  if (should_record({&logits_in})) {
    record("cross_entropy", {&logits_in}, {&loss}, [=](const std::vector<Tensor>& gs) {
      const Tensor dloss = gs[0].contiguous();
      BackendImpl& b = backend_of(logits);
      profiler::OpScope scope("cross_entropy.backward", b.kind(), {&logits, &target},
                              [&] { return cost::cross_entropy(logits.shape(), elem); });
      Tensor dlogits = Tensor::empty(logits.shape(), TensorOptions(logits.dtype()).with_device(logits.device()));
      b.cross_entropy_backward(logits, target, dloss, dlogits, label_smoothing);
      return std::vector<Tensor>{dlogits};
    });
  }
  return loss;
}

Tensor dropout(const Tensor& x_in, double p, bool training, Generator* g) {
  check_float("dropout", "input", x_in);
  DUET_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability must be in [0, 1], got {}", p);
  if (!training || p == 0.0) return x_in;
  const Tensor x = dense(x_in.detach());
  Generator& gen = g ? *g : default_generator();
  const uint64_t offset = gen.reserve(static_cast<uint64_t>(x.numel()));
  BackendImpl& be = backend_of(x);
  Tensor y, mask;
  {
    profiler::OpScope scope("dropout", be.kind(), {&x});
    y = empty_like_layout(x, x.shape());
    mask = empty_like_layout(x, x.shape());
    scope.set_cost([&] { return cost::elementwise({&x}, {&y, &mask}, 2); });
    be.dropout(x, y, mask, p, gen.seed, offset);
  }
  if (should_record({&x_in})) {
    record("dropout", {&x_in}, {&y}, [=](const std::vector<Tensor>& gs) {
      return std::vector<Tensor>{mul(gs[0], mask)};
    });
  }
  return y;
}

}  // namespace duet
