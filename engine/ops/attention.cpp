// Front-end of multi-head self-attention from a packed q/k/v projection: the fused op where the
// backend has it, else the same maths composed from matmul, softmax and views.
#include <cmath>
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

namespace {

// softmax(q k^T / sqrt(Dh)) v from matmul and softmax; q is scaled before the product, as
// torch.nn.MultiheadAttention does.
Tensor composed_attention(const Tensor& qkv, int64_t heads, double dropout_p, bool training) {
  const int64_t N = qkv.size(0), S = qkv.size(1), D = qkv.size(2) / 3, Dh = D / heads;
  // [N, S, 3, H, Dh] -> [3, N, H, S, Dh] is a view; unbind (not three selects) so that the backward
  // writes the three gradients into one buffer.
  const std::vector<Tensor> parts = unbind(qkv.view({N, S, 3, heads, Dh}).permute({2, 0, 3, 1, 4}), 0);
  const Tensor q = mul(parts[0], 1.0 / std::sqrt(static_cast<double>(Dh)));
  Tensor probs = softmax(matmul(q, parts[1].transpose(-1, -2)), -1);  // [N, H, S, S]
  if (dropout_p > 0) probs = dropout(probs, dropout_p, training);
  return matmul(probs, parts[2]).permute({0, 2, 1, 3}).reshape({N, S, D});  // heads back side by side
}

}  // namespace

Tensor attention(const Tensor& qkv_in, int64_t heads, double dropout_p, bool training) {
  check_float_or_half("attention", "qkv", qkv_in);
  check_dim("attention", "qkv", qkv_in, 3);
  DUET_CHECK(heads > 0 && qkv_in.size(2) % (3 * heads) == 0,
             "attention: qkv has shape {}: its last dim must be 3 * heads * head_dim with heads = {}",
             shape_str(qkv_in.shape()), heads);
  DUET_CHECK(qkv_in.size(2) > 0 && qkv_in.size(1) > 0, "attention: qkv has shape {}: expected a sequence and channels",
             shape_str(qkv_in.shape()));
  DUET_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "attention: dropout must be in [0, 1), got {}", dropout_p);
  BackendImpl& be = backend_of(qkv_in);
  if ((dropout_p > 0 && training) || !routing(be).fuses_attention(qkv_in.dtype()))
    return composed_attention(qkv_in, heads, dropout_p, training);

  const int64_t N = qkv_in.size(0), S = qkv_in.size(1), D = qkv_in.size(2) / 3;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D / heads));
  const Tensor qkv = untracked(qkv_in).contiguous();
  const TensorOptions opts = TensorOptions(qkv.dtype()).with_device(qkv.device());
  Tensor out, probs;
  {
    Dispatch<OpId::attention> kernel(be, {&qkv});
    out = Tensor::empty({N, S, D}, opts);
    probs = Tensor::empty({N, heads, S, S}, opts);
    kernel(qkv, heads, scale, out, probs);
  }
  if (should_record({&qkv_in})) {
    record("attention", {&qkv_in}, {&out}, [=](const std::vector<Tensor>& gs) {
      const Tensor dout = gs[0].contiguous();
      Dispatch<OpId::attention_backward> kernel(backend_of(dout), {&qkv, &probs, &dout});
      Tensor dqkv = Tensor::empty(qkv.shape(), TensorOptions(qkv.dtype()).with_device(qkv.device()));
      kernel(qkv, probs, dout, heads, scale, dqkv);
      return std::vector<Tensor>{dqkv};
    });
  }
  return out;
}

}  // namespace duet
