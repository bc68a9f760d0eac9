// The differentiable ops users call. Each front-end (engine/ops/*.cpp) validates its arguments
// (the message names the op, the argument, what was given and what was expected), computes the
// output shape, opens a profiler scope, dispatches to the tensor's backend and records the
// autograd node. Forward ops are named like the op ("conv2d"); their backward ops are named
// "conv2d.backward_data", "conv2d.backward_weight", ... in the profiler.
#pragma once
#include <optional>
#include <vector>
#include "engine/op_params.h"
#include "engine/tensor.h"

namespace duet {

// ---- elementwise ---------------------------------------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);  // numpy broadcasting
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);  // 1 where equal, else 0; not differentiable
Tensor gt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
// acc += b in place, b of acc's shape; not recorded by autograd (it is how autograd itself sums
// the gradients reaching one tensor, as PyTorch's engine does). Profiled as "add".
void add_(const Tensor& acc, const Tensor& b);

Tensor add(const Tensor& x, double s);
Tensor mul(const Tensor& x, double s);
Tensor pow(const Tensor& x, double s);
Tensor rsub(const Tensor& x, double s);  // s - x
Tensor rdiv(const Tensor& x, double s);  // s / x
Tensor clamp_min(const Tensor& x, double s);
Tensor clamp_max(const Tensor& x, double s);
Tensor scalar_op(ScalarOp op, const Tensor& x, double s);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor square(const Tensor& x);
Tensor unary(UnaryOp op, const Tensor& x);

Tensor relu(const Tensor& x);
Tensor relu6(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor sigmoid(const Tensor& x);
Tensor silu(const Tensor& x);
Tensor hardswish(const Tensor& x);
Tensor leaky_relu(const Tensor& x, double negative_slope = 0.01);
// Any activation of engine/scalar_math.h; alpha is its parameter (LeakyReLU's slope), the
// activation's default when not given.
Tensor activation(Activation act, const Tensor& x, std::optional<double> alpha = std::nullopt);

inline Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
inline Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
inline Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
inline Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
inline Tensor operator-(const Tensor& a) { return neg(a); }
inline Tensor operator+(const Tensor& a, double s) { return add(a, s); }
inline Tensor operator-(const Tensor& a, double s) { return add(a, -s); }
inline Tensor operator*(const Tensor& a, double s) { return mul(a, s); }
inline Tensor operator/(const Tensor& a, double s) { return mul(a, 1.0 / s); }
inline Tensor operator*(double s, const Tensor& a) { return mul(a, s); }
inline Tensor operator+(double s, const Tensor& a) { return add(a, s); }
inline Tensor operator-(double s, const Tensor& a) { return rsub(a, s); }

// ---- reductions (dims empty = all dims) ------------------------------------------------------
Tensor sum(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amax(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, std::vector<int64_t> dims = {}, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  // i64, not differentiable
// Sums a broadcast gradient back to `shape` (the inverse of expand).
Tensor sum_to(const Tensor& x, const Shape& shape);

// ---- linear algebra ---------------------------------------------------------------------------
// a [..., M, K] @ b [..., K, N] with broadcast batch dims; 1-D operands are not supported.
Tensor matmul(const Tensor& a, const Tensor& b);
// y = x w^T + bias: x [..., in], w [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor());

// ---- convolution and pooling (NCHW logical dims; channels-last memory is kept) --------------
// With a residual (the output's shape): act(conv(x) + bias + residual), p.act none, relu or relu6,
// in one kernel where the backend can (a frozen model's conv + folded batch norm: nn::conv_bn).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias = Tensor(), const Conv2dParams& p = {},
              const Tensor& residual = Tensor());
Tensor max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);

// ---- normalisation ----------------------------------------------------------------------------
// x [N,C,H,W] or [N,C]; running stats are updated in place in training mode (may be undefined
// in training mode: then no running stats are kept). With a residual (x's shape), the result is
// bn(x) + residual; p.act (relu or relu6) is applied last. One pass: a ResNet block's last three ops.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormParams& p, const Tensor& residual = Tensor());
// Over the last dim; gamma/beta [D] or undefined.
Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, double eps = 1e-5);

// ---- attention ----------------------------------------------------------------------------------
// Multi-head self-attention from a packed projection: qkv [N, S, 3 * heads * Dh] holds q, k and v
// side by side (a ViT's in-projection output, `view({N, S, 3, heads, Dh})`); returns
// softmax(q k^T / sqrt(Dh)) v with the heads side by side, [N, S, heads * Dh]; in training,
// dropout_p drops attention weights. One fused op where the backend has it (the cpu backend in f32
// reads q, k and v in place and writes their gradients into the packed layout directly) and no
// dropout applies, else matmul, softmax and the permutes.
Tensor attention(const Tensor& qkv, int64_t heads, double dropout_p = 0.0, bool training = false);

// ---- softmax, losses, dropout -------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);
// Mean cross-entropy of logits [N, C] against class indices target (i64 [N]).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, double label_smoothing = 0.0);
// Inverted dropout; identity when !training or p == 0.
Tensor dropout(const Tensor& x, double p, bool training, Generator* g = nullptr);

// ---- shape ------------------------------------------------------------------------------------
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);  // views
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);                       // views
std::vector<Tensor> unbind(const Tensor& x, int64_t dim);  // views x.select(dim, i) for every i

// ---- optimizer kernels (in place, no autograd; used by engine/optim) -------------------------
void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SgdParams& p, bool first_step);
void adam_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                const AdamParams& p);

}  // namespace duet
