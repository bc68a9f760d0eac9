// Front-ends of batch norm and layer norm. Training-mode batch norm has its own backward kernel
// (the statistics depend on every element of the batch); eval-mode batch norm is an affine map
// per channel, whose gradient is written with elementwise ops.
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

Tensor batch_norm(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, const BatchNormParams& p, const Tensor& residual) {
  check_float_or_half("batch_norm", "input", x_in);
  check_fused_activation("batch_norm", p.act);
  DUET_CHECK(x_in.dim() == 4 || x_in.dim() == 2, "batch_norm: input has shape {}, expected [N, C, H, W] or [N, C]",
             shape_str(x_in.shape()));
  if (residual.defined()) {
    DUET_CHECK(residual.device() == x_in.device(), "batch_norm: residual is on {}, input on {}: expected one device",
               residual.device().str(), x_in.device().str());
    check_shape("batch_norm", "residual", residual, x_in.shape());
    if (residual.dtype() != x_in.dtype()) {
      // A residual of another dtype (an f32 stream meeting a bf16 branch) promotes as add() does:
      // the same ops, unfused.
      BatchNormParams q = p;
      q.act.reset();
      const Tensor y = add(batch_norm(x_in, gamma, beta, running_mean, running_var, q), residual);
      return p.act ? activation(*p.act, y) : y;
    }
  }
  const int64_t C = x_in.size(1);
  // A 16-bit input (a mixed-precision network's activations) is normalised with f32 parameters and
  // statistics, as PyTorch keeps a BatchNorm's: the activations are 16-bit, the sums are not.
  check_defined("batch_norm", "weight", gamma);
  if (is_half(x_in.dtype())) {
    check_dtype("batch_norm", "weight", gamma, DType::f32);
  } else {
    check_same("batch_norm", "weight", gamma, "input", x_in);
  }
  DUET_CHECK(gamma.device() == x_in.device(), "batch_norm: weight is on {}, input on {}: expected one device",
             gamma.device().str(), x_in.device().str());
  check_shape("batch_norm", "weight", gamma, {C});
  check_same("batch_norm", "bias", beta, "weight", gamma);
  check_shape("batch_norm", "bias", beta, {C});
  DUET_CHECK(p.eps > 0, "batch_norm: eps must be positive, got {}", p.eps);
  const TensorOptions opts = TensorOptions(x_in.dtype()).with_device(x_in.device());
  const TensorOptions param_opts = TensorOptions(gamma.dtype()).with_device(x_in.device());
  Tensor rm = running_mean, rv = running_var;
  if (!p.training) {
    DUET_CHECK(rm.defined() && rv.defined(), "batch_norm: eval mode needs running_mean and running_var");
  }
  if (rm.defined() || rv.defined()) {
    check_same("batch_norm", "running_mean", rm, "weight", gamma);
    check_shape("batch_norm", "running_mean", rm, {C});
    check_same("batch_norm", "running_var", rv, "weight", gamma);
    check_shape("batch_norm", "running_var", rv, {C});
  } else {  // training without running statistics: scratch buffers the kernel may update
    rm = Tensor::zeros({C}, param_opts);
    rv = Tensor::ones({C}, param_opts);
  }
  if (p.training) {
    check_writable("batch_norm (training updates the running statistics)", rm);
    check_writable("batch_norm (training updates the running statistics)", rv);
    const int64_t per_channel = x_in.numel() / std::max<int64_t>(C, 1);
    DUET_CHECK(per_channel > 1, "batch_norm: training needs more than one value per channel, got input shape {}",
               shape_str(x_in.shape()));
  }
  // The saved statistics serve only the backward: a pass that records no graph (inference) asks
  // for none, and the backends leave them unwritten.
  const bool recording = should_record({&x_in, &gamma, &beta, &residual});
  // A slice of a channels-last tensor's channels stays channels-last: read where it lies in
  // inference where the backend can, else copied into a channels-last tensor of its own.
  const bool channel_slice = x_in.dim() == 4 && channel_row_stride(x_in) > x_in.size(1);
  const bool slice_in_place = channel_slice && !p.training && !recording && !residual.defined() &&
                              routing(backend_of(x_in)).reads_channel_slices_in_batch_norm(x_in);
  const MemoryFormat f = channel_slice ? MemoryFormat::channels_last : x_in.suggest_memory_format();
  const Tensor x = slice_in_place ? untracked(x_in) : in_format(untracked(x_in), f);
  const Tensor r = residual.defined() ? in_format(untracked(residual), f) : Tensor();
  Tensor y, save_mean, save_invstd;
  {
    Dispatch<OpId::batch_norm> kernel(backend_of(x), {&x, &r});
    y = x.dim() == 4 ? Tensor::empty(x.shape(), opts, f) : Tensor::empty(x.shape(), opts);
    if (recording) {
      save_mean = Tensor::empty({C}, param_opts);
      save_invstd = Tensor::empty({C}, param_opts);
    }
    kernel(x, untracked(gamma), untracked(beta), rm, rv, r, y, save_mean, save_invstd, p);
  }
  if (recording) {
    const bool need_x = x_in.requires_grad(), need_g = gamma.requires_grad(), need_b = beta.requires_grad();
    const bool need_r = residual.defined() && residual.requires_grad();
    const Tensor gd = untracked(gamma);
    const bool training = p.training;
    // Without a residual the backend may recompute the activation's mask from x in the backward
    // (a pass over y, dy and the masked gradient less); else the op keeps its output for the mask
    // (the next layer keeps y anyway).
    const bool act_in_backward =
        p.act && !r.defined() && training && routing(backend_of(x)).fuses_batch_norm_activation_backward(x);
    const Tensor bd = act_in_backward ? untracked(beta) : Tensor();
    const Tensor yd = p.act && !act_in_backward ? y.detach() : Tensor();
    record("batch_norm", {&x_in, &gamma, &beta, &residual}, {&y}, [=](const std::vector<Tensor>& gs) {
      Tensor dx, dgamma, dbeta;
      const Tensor g_out = p.act && !act_in_backward ? activation_backward_op(*p.act, yd, gs[0]) : gs[0];
      const Tensor dresidual = need_r ? g_out : Tensor();  // y = bn(x) + residual
      if (training) {
        const Tensor dy = in_format(g_out, x.dim() == 4 ? f : MemoryFormat::contiguous);
        const std::optional<Activation> act = act_in_backward ? p.act : std::nullopt;
        Dispatch<OpId::batch_norm_backward> kernel(backend_of(dy), {&dy, &x});
        if (need_x) dx = Tensor::empty_like(x);
        if (need_g) dgamma = Tensor::empty({C}, param_opts);
        if (need_b) dbeta = Tensor::empty({C}, param_opts);
        kernel(dy, x, gd, bd, save_mean, save_invstd, dx, dgamma, dbeta, p.eps, act);
      } else {
        // y = (x - mean) * invstd * gamma + beta with constant statistics.
        const Shape cs = x.dim() == 4 ? Shape{1, C, 1, 1} : Shape{1, C};
        const Tensor invstd = save_invstd.view(cs), mu = save_mean.view(cs);
        const Tensor& g = g_out;
        std::vector<int64_t> red = x.dim() == 4 ? std::vector<int64_t>{0, 2, 3} : std::vector<int64_t>{0};
        // (A 16-bit g promotes to f32 with the f32 statistics; dx goes back to x's dtype, the
        // parameters' gradients stay in theirs.)
        if (need_x) dx = mul(g, mul(invstd, gd.view(cs))).to(x.dtype());
        if (need_g) dgamma = sum(mul(g, mul(sub(x, mu), invstd)), red).to(gd.dtype());
        if (need_b) dbeta = sum(g, red).to(gd.dtype());
      }
      return std::vector<Tensor>{dx, dgamma, dbeta, dresidual};
    });
  }
  return y;
}

Tensor layer_norm(const Tensor& x_in, const Tensor& gamma, const Tensor& beta, double eps) {
  check_float_or_half("layer_norm", "input", x_in);
  // A 16-bit input (ConvNeXt's norm after a mixed-precision depthwise convolution) is normalised
  // in f32 with f32 parameters and rounded once, as PyTorch's autocast runs layer_norm in f32.
  if (is_half(x_in.dtype())) return layer_norm(x_in.to(DType::f32), gamma, beta, eps).to(x_in.dtype());
  DUET_CHECK(x_in.dim() >= 1, "layer_norm: input must have at least one dim");
  DUET_CHECK(eps > 0, "layer_norm: eps must be positive, got {}", eps);
  const int64_t D = x_in.size(-1);
  if (gamma.defined()) {
    check_same("layer_norm", "weight", gamma, "input", x_in);
    check_shape("layer_norm", "weight", gamma, {D});
  }
  if (beta.defined()) {
    check_same("layer_norm", "bias", beta, "input", x_in);
    check_shape("layer_norm", "bias", beta, {D});
  }
  const TensorOptions opts = TensorOptions(x_in.dtype()).with_device(x_in.device());
  const Tensor x = untracked(x_in).contiguous();
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  const Tensor gd = gamma.defined() ? untracked(gamma) : Tensor(), bd = beta.defined() ? untracked(beta) : Tensor();
  Tensor y, mean, rstd;
  {
    Dispatch<OpId::layer_norm> kernel(backend_of(x), {&x});
    y = Tensor::empty(x.shape(), opts);
    mean = Tensor::empty({rows}, opts);
    rstd = Tensor::empty({rows}, opts);
    kernel(x, gd, bd, y, mean, rstd, eps);
  }
  if (should_record({&x_in, &gamma, &beta})) {
    const bool need_x = x_in.requires_grad();
    const bool need_g = gamma.defined() && gamma.requires_grad(), need_b = beta.defined() && beta.requires_grad();
    record("layer_norm", {&x_in, &gamma, &beta}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = gs[0].contiguous();
      Tensor dx, dgamma, dbeta;
      Dispatch<OpId::layer_norm_backward> kernel(backend_of(dy), {&dy, &x});
      if (need_x) dx = Tensor::empty(x.shape(), opts);
      if (need_g) dgamma = Tensor::empty({D}, opts);
      if (need_b) dbeta = Tensor::empty({D}, opts);
      kernel(dy, x, gd, mean, rstd, dx, dgamma, dbeta);
      return std::vector<Tensor>{dx, dgamma, dbeta};
    });
  }
  return y;
}

}  // namespace duet
