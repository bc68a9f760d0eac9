// Front-end of conv2d: the checks, the output shape and the autograd node; which kernel runs is
// each backend's planner's business. The output keeps the input's memory format (NCHW or
// channels-last), as PyTorch does, so a network fed channels-last activations stays channels-last
// end to end. The backward is one conv2d_backward call for the gradients someone needs (ATen's
// output mask). Under autocast (engine/autocast.h) it runs in f16/bf16.
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

Tensor conv2d(const Tensor& x_in, const Tensor& w, const Tensor& bias, const Conv2dParams& p, const Tensor& residual) {
  check_fused_activation("conv2d", p.act);
  // Under autocast: cast f32 input, weight and bias to the low dtype and convolve there. Where the
  // backend keeps low-precision activations the output stays low and the epilogue stays fused (the
  // residual cast too); elsewhere the output goes back to f32 and the epilogue runs after it as
  // ordinary ops (f16 has no activation kernels on the CPU).
  if (const auto low = autocast_target({&x_in, &w, &bias})) {
    const Tensor xl = autocast_input(x_in, *low), wl = autocast_input(w, *low), bl = autocast_input(bias, *low);
    if (routing(backend_of(xl)).keeps_low_precision_activations(*low))
      return conv2d(xl, wl, bl, p, autocast_input(residual, *low));
    Conv2dParams q = p;
    q.act.reset();
    const Tensor y = autocast_output(conv2d(xl, wl, bl, q));
    const Tensor z = residual.defined() ? add(y, residual) : y;
    return p.act ? activation(*p.act, z) : z;
  }
  check_float_or_half("conv2d", "input", x_in);
  check_dim("conv2d", "input", x_in, 4);
  check_same("conv2d", "weight", w, "input", x_in);
  check_dim("conv2d", "weight", w, 4);
  DUET_CHECK(p.groups >= 1 && p.stride_h >= 1 && p.stride_w >= 1 && p.dilation_h >= 1 && p.dilation_w >= 1 &&
                 p.pad_h >= 0 && p.pad_w >= 0,
             "conv2d: invalid attributes stride=({}, {}) padding=({}, {}) dilation=({}, {}) groups={}: expected "
             "stride, dilation, groups >= 1 and padding >= 0",
             p.stride_h, p.stride_w, p.pad_h, p.pad_w, p.dilation_h, p.dilation_w, p.groups);
  const int64_t N = x_in.size(0), C = x_in.size(1), H = x_in.size(2), W = x_in.size(3);
  const int64_t O = w.size(0), KH = w.size(2), KW = w.size(3);
  DUET_CHECK(C == w.size(1) * p.groups,
             "conv2d: input has {} channels but weight {} with groups={} expects {} (weight dim 1 times groups)", C,
             shape_str(w.shape()), p.groups, w.size(1) * p.groups);
  DUET_CHECK(O % p.groups == 0, "conv2d: weight has {} output channels, not divisible by groups={}", O, p.groups);
  if (bias.defined()) {
    check_same("conv2d", "bias", bias, "input", x_in);
    check_shape("conv2d", "bias", bias, {O});
  }

  const int64_t OH = conv_out_size(H, KH, p.stride_h, p.pad_h, p.dilation_h);
  const int64_t OW = conv_out_size(W, KW, p.stride_w, p.pad_w, p.dilation_w);
  DUET_CHECK(OH > 0 && OW > 0,
             "conv2d: a {}x{} kernel (dilation {}x{}, padding {}x{}) does not fit the {}x{} input {}: output would be "
             "{}x{}",
             KH, KW, p.dilation_h, p.dilation_w, p.pad_h, p.pad_w, H, W, shape_str(x_in.shape()), OH, OW);
  if (residual.defined()) {
    check_same("conv2d", "residual", residual, "input", x_in);
    check_shape("conv2d", "residual", residual, {N, O, OH, OW});
  }

  const MemoryFormat f = x_in.suggest_memory_format();
  const Tensor x = in_format(untracked(x_in), f);
  const Tensor wk = w.is_dense() ? untracked(w) : untracked(w).contiguous();
  const Tensor r = residual.defined() ? in_format(untracked(residual), f) : Tensor();
  Tensor y;
  {
    Dispatch<OpId::conv2d> kernel(backend_of(x), {&x, &w, &r});
    y = Tensor::empty({N, O, OH, OW}, TensorOptions(x.dtype()).with_device(x.device()), f);
    kernel(x, wk, bias, r, y, p);
  }
  if (should_record({&x_in, &w, &bias, &residual})) {
    const bool need_x = x_in.requires_grad(), need_w = w.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    const Shape xs = x.shape(), ys = y.shape(), ws = wk.shape();
    const MemoryFormat wf = wk.suggest_memory_format();
    // Keep x only if the weight gradient needs it: inference-style inputs are not held.
    const Tensor xd = need_w ? x : Tensor();
    const Tensor wd = need_x ? wk : Tensor();
    const bool need_r = residual.defined() && residual.requires_grad();
    const Tensor yd = p.act ? y.detach() : Tensor();  // the fused activation's mask (the next layer keeps y anyway)
    const DType dt = x.dtype();
    const Device dev = x.device();
    record("conv2d", {&x_in, &w, &bias, &residual}, {&y}, [=](const std::vector<Tensor>& gs) {
      const Tensor dy = in_format(p.act ? activation_backward_op(*p.act, yd, gs[0]) : gs[0], f);
      Tensor dx, dw, db;
      if (need_x || need_w) {
        // One call for both gradients, each allocated only when wanted (the output mask).
        Dispatch<OpId::conv2d_backward> kernel(backend_of(dy), {&dy, &xd, &wd});
        if (need_x) dx = Tensor::empty(xs, TensorOptions(dt).with_device(dev), f);
        // In the weight's layout: a channels-last weight (Module::to) gets a channels-last
        // gradient, which the leaf then takes without a copy.
        if (need_w) dw = Tensor::empty(ws, TensorOptions(dt).with_device(dev), wf);
        if (need_w && need_b) db = Tensor::empty({ys[1]}, TensorOptions(dt).with_device(dev));
        kernel(dy, xd, wd, dx, dw, db, p);
      }
      if (need_b && !need_w) db = sum(dy, {0, 2, 3});  // bias-only gradient (frozen weight)
      return std::vector<Tensor>{dx, dw, db, need_r ? dy : Tensor()};  // y = ... + residual
    });
  }
  return y;
}

}  // namespace duet
