// 2-D convolution on the host, as direct loops over the definition (no im2col, no Winograd):
// forward, gradient wrt the input and gradient wrt the weight and bias. Every tensor is indexed
// through its strides, so NCHW and channels-last share the code; each output element is gathered
// once into an accumulator (double; float for f16/bf16 data, see acc_t), so the backward passes
// overwrite rather than accumulate.
#include "engine/conv_epilogue.h"
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"
#include "engine/conv_backward.h"

namespace duet {
using namespace ref;

namespace {

// PyTorch's conv2d is a cross-correlation:
//   y[n, o, oh, ow] = bias[o] + sum_{c, kh, kw} x[n, g*Cg + c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw] * w[o, c, kh, kw]
// where g = o / Og is o's group, Cg = C / groups input channels and Og = O / groups outputs per
// group; taps that fall in the zero padding contribute nothing.
template <class T>
void conv2d_kernel(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& y, const Conv2dParams& p) {
  using Acc = acc_t<T>;
  const View4 X(x), Wt(w), Y(y);
  const int64_t Cg = X.C / p.groups, Og = Y.C / p.groups;
  const int64_t KH = Wt.H, KW = Wt.W;
  const T* px = ptr<T>(x);
  const T* pw = ptr<T>(w);
  const T* pbias = bias.defined() ? ptr<T>(bias) : nullptr;
  T* py = ptr<T>(y);
  for (int64_t n = 0; n < X.N; ++n)
    for (int64_t o = 0; o < Y.C; ++o) {
      const int64_t c0 = (o / Og) * Cg;
      const Acc b = pbias ? Acc(widen(pbias[o * bias.stride(0)])) : Acc(0);
      for (int64_t oh = 0; oh < Y.H; ++oh)
        for (int64_t ow = 0; ow < Y.W; ++ow) {
          const int64_t ih0 = oh * p.stride_h - p.pad_h, iw0 = ow * p.stride_w - p.pad_w;
          Acc acc = b;
          for (int64_t c = 0; c < Cg; ++c)
            for (int64_t kh = 0; kh < KH; ++kh) {
              const int64_t ih = ih0 + kh * p.dilation_h;
              if (ih < 0 || ih >= X.H) continue;
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t iw = iw0 + kw * p.dilation_w;
                if (iw < 0 || iw >= X.W) continue;
                acc += Acc(widen(px[X.at(n, c0 + c, ih, iw)])) * Acc(widen(pw[Wt.at(o, c, kh, kw)]));
              }
            }
          py[Y.at(n, o, oh, ow)] = narrow<T>(acc);
        }
    }
}

// dx[n, c, ih, iw] collects dy[n, o, oh, ow] * w[o, c % Cg, kh, kw] over every (o, kh, kw) whose tap
// lands on (ih, iw): ih = oh*sh - ph + kh*dh, so oh = (ih + ph - kh*dh) / sh must be a whole
// number inside [0, OH). Gathering (instead of scattering the forward taps) writes each dx once.
template <class T>
void conv2d_backward_data_kernel(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  using Acc = acc_t<T>;
  const View4 DY(dy), Wt(w), DX(dx);
  const int64_t Cg = DX.C / p.groups, Og = DY.C / p.groups;
  const int64_t KH = Wt.H, KW = Wt.W;
  const T* pdy = ptr<T>(dy);
  const T* pw = ptr<T>(w);
  T* pdx = ptr<T>(dx);
  for (int64_t n = 0; n < DX.N; ++n)
    for (int64_t c = 0; c < DX.C; ++c) {
      const int64_t g = c / Cg, cg = c % Cg;
      for (int64_t ih = 0; ih < DX.H; ++ih)
        for (int64_t iw = 0; iw < DX.W; ++iw) {
          Acc acc = 0;
          for (int64_t o = g * Og; o < (g + 1) * Og; ++o)
            for (int64_t kh = 0; kh < KH; ++kh) {
              const int64_t th = ih + p.pad_h - kh * p.dilation_h;
              if (th < 0 || th % p.stride_h != 0) continue;
              const int64_t oh = th / p.stride_h;
              if (oh >= DY.H) continue;
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t tw = iw + p.pad_w - kw * p.dilation_w;
                if (tw < 0 || tw % p.stride_w != 0) continue;
                const int64_t ow = tw / p.stride_w;
                if (ow >= DY.W) continue;
                acc += Acc(widen(pdy[DY.at(n, o, oh, ow)])) * Acc(widen(pw[Wt.at(o, cg, kh, kw)]));
              }
            }
          pdx[DX.at(n, c, ih, iw)] = narrow<T>(acc);
        }
    }
}

// dw[o, c, kh, kw] = sum_{n, oh, ow} dy[n, o, oh, ow] * x[n, g*Cg + c, oh*sh - ph + kh*dh, ow*sw - pw + kw*dw]
// dbias[o]         = sum_{n, oh, ow} dy[n, o, oh, ow]
template <class T>
void conv2d_backward_weight_kernel(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                                   const Conv2dParams& p) {
  using Acc = acc_t<T>;
  const View4 X(x), DY(dy), DW(dw);
  const int64_t Cg = X.C / p.groups, Og = DY.C / p.groups;
  const T* px = ptr<T>(x);
  const T* pdy = ptr<T>(dy);
  T* pdw = ptr<T>(dw);
  for (int64_t o = 0; o < DY.C; ++o) {
    const int64_t c0 = (o / Og) * Cg;
    for (int64_t c = 0; c < Cg; ++c)
      for (int64_t kh = 0; kh < DW.H; ++kh)
        for (int64_t kw = 0; kw < DW.W; ++kw) {
          Acc acc = 0;
          for (int64_t n = 0; n < X.N; ++n)
            for (int64_t oh = 0; oh < DY.H; ++oh) {
              const int64_t ih = conv_in_index(oh, kh, p.stride_h, p.pad_h, p.dilation_h);
              if (ih < 0 || ih >= X.H) continue;
              for (int64_t ow = 0; ow < DY.W; ++ow) {
                const int64_t iw = conv_in_index(ow, kw, p.stride_w, p.pad_w, p.dilation_w);
                if (iw < 0 || iw >= X.W) continue;
                acc += Acc(widen(pdy[DY.at(n, o, oh, ow)])) * Acc(widen(px[X.at(n, c0 + c, ih, iw)]));
              }
            }
          pdw[DW.at(o, c, kh, kw)] = narrow<T>(acc);
        }
  }
  if (!dbias.defined()) return;
  T* pdb = ptr<T>(dbias);
  for (int64_t o = 0; o < DY.C; ++o) {
    Acc acc = 0;
    for (int64_t n = 0; n < DY.N; ++n)
      for (int64_t oh = 0; oh < DY.H; ++oh)
        for (int64_t ow = 0; ow < DY.W; ++ow) acc += Acc(widen(pdy[DY.at(n, o, oh, ow)]));
    pdb[o * dbias.stride(0)] = narrow<T>(acc);
  }
}

}  // namespace

void ReferenceBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual,
                              const Tensor& y, const Conv2dParams& p) {
  dispatch_float_or_half(x.dtype(), "conv2d", [&](auto tag) { conv2d_kernel<decltype(tag)>(x, w, bias, y, p); });
  conv_epilogue_passes(*this, y, residual, p.act);  // the reference does not fuse: passes after it
}

// Both gradients (ops.def's output mask), each in its profiled window (engine/conv_backward.h).
void ReferenceBackend::conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& dx,
                                       const Tensor& dw, const Tensor& db, const Conv2dParams& p) {
  if (dx.defined()) {
    const profiler::OpScope window = data_gradient_window(Backend::reference, dy, w, dx);
    dispatch_float_or_half(dy.dtype(), "conv2d_backward",
                           [&](auto tag) { conv2d_backward_data_kernel<decltype(tag)>(dy, w, dx, p); });
  }
  if (dw.defined()) {
    const profiler::OpScope window = weight_gradient_window(Backend::reference, x, dy, dw, db);
    dispatch_float_or_half(x.dtype(), "conv2d_backward",
                           [&](auto tag) { conv2d_backward_weight_kernel<decltype(tag)>(x, dy, dw, db, p); });
  }
}

}  // namespace duet
