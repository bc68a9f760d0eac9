// The passes of a convolution that run as matrix products on oneDNN's matmul primitive (gemm.h):
// pointwise convolutions on the pixel rows of channels-last maps, weight gradients on an im2col
// matrix, and a KxK kernel over a 1x1 map through its one tap. The planner (planner.h) says when
// and why; conv_kernels.h lists them.
#include <cstring>
#include <vector>
#include "backends/cpu/common.h"
#include "backends/cpu/conv_kernels.h"
#include "backends/cpu/gemm.h"
#include "engine/conv_epilogue.h"
#include "engine/half.h"

namespace duet::cpu {

namespace {
// Pointwise convolutions as matrix products (planner.h): the maps as [P = N*H*W, C] pixel rows,
// the weights as the row-major [O, C] matrix.
MatrixOperand pixel_rows(const Tensor& t) {
  const int64_t rows = t.size(0) * t.size(2) * t.size(3), C = t.size(1);
  return {t, rows, C, C, 1};
}
MatrixOperand weight_matrix(const Tensor& w, bool transposed) {
  const int64_t O = w.size(0), C = w.size(1);
  return transposed ? MatrixOperand{w, C, O, 1, C} : MatrixOperand{w, O, C, C, 1};
}
MatrixOperand transposed(const MatrixOperand& m) { return {m.t, m.cols, m.rows, m.col, m.row, m.batch_stride}; }
// How many chunks the P pixel rows of a weight gradient are summed in: one per thread while each
// keeps at least kMinChunkRows rows and all are the same size (a batched product's matrices are).
int64_t weight_gradient_chunks(int64_t P) {
  constexpr int64_t kMinChunkRows = 1024;
  int64_t chunks = max_threads();
  while (chunks > 1 && (P % chunks != 0 || P / chunks < kMinChunkRows)) --chunks;
  return chunks;
}

// x's im2col matrix, [P = N*OH*OW, KH*KW*C]: row (n, oh, ow) holds the receptive field of that
// output pixel, tap by tap, each tap the C channels of one input pixel (zeros outside the map).
void im2col_nhwc(const Tensor& x, const Tensor& col, int64_t OH, int64_t OW, int64_t KH, int64_t KW,
                 const Conv2dParams& p) {
  const int64_t H = x.size(2), W = x.size(3), C = x.size(1), P = x.size(0) * OH * OW;
  const size_t es = dtype_size(x.dtype()), tap = static_cast<size_t>(C) * es;
  const char* src = static_cast<const char*>(x.raw_data());
  char* dst = static_cast<char*>(col.raw_data());
  parallel_for(P, P * KH * KW * C, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t n = r / (OH * OW), oh = r / OW % OH, ow = r % OW;
      char* row = dst + static_cast<size_t>(r * KH * KW) * tap;
      for (int64_t kh = 0; kh < KH; ++kh)
        for (int64_t kw = 0; kw < KW; ++kw, row += tap) {
          const int64_t ih = conv_in_index(oh, kh, p.stride_h, p.pad_h, p.dilation_h);
          const int64_t iw = conv_in_index(ow, kw, p.stride_w, p.pad_w, p.dilation_w);
          if (ih < 0 || ih >= H || iw < 0 || iw >= W) std::memset(row, 0, tap);
          else std::memcpy(row, src + static_cast<size_t>((n * H + ih) * W + iw) * tap, tap);
        }
    }
  });
}

// c = a @ b + bias, then y's epilogue: inside the product when the residual lies in memory as y
// does (as_matrix gives both the same matrix view), else as passes after it. The passes add the
// residual to the rounded product, the post-op to the f32 accumulator; in f32 the two agree to
// rounding, in bf16 by one rounding of the output.
template <class AsMatrix>
void product_with_epilogue(const char* op, const MatrixOperand& a, const MatrixOperand& b, const Tensor& y,
                           AsMatrix as_matrix, const Tensor& bias, const Tensor& residual, std::optional<Activation> act) {
  const MatrixOperand c = as_matrix(y);
  if (!residual.defined() || same_layout(residual, y)) {
    const MatrixOperand r = residual.defined() ? as_matrix(residual) : c;
    return gemm(op, a, b, c, bias, {residual.defined() ? &r : nullptr, act});
  }
  gemm(op, a, b, c, bias);
  conv_epilogue_passes(cpu_backend(), y, residual, act);
}

// The weights as the [O, KH*KW*C] matrix of im2col's tap order (OHWI). A channels-last weight is
// that already. A frozen one (inference) is copied once per freeze and kept, frozen itself so that
// the matrix product keeps its packed copy of it too; any other is copied at every call.
Tensor ohwi_weights(const Tensor& w) {
  const Tensor ohwi = w.permute({0, 2, 3, 1});
  if (ohwi.is_contiguous()) return ohwi;
  if (!w.is_frozen()) return ohwi.contiguous();
  return frozen_copy(w, "ohwi weights", [&] {
    const Tensor t = ohwi.contiguous();
    t.freeze();
    return t;
  });
}

}  // namespace

// y = act(x W^T + bias + residual)
void pointwise_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                       std::optional<Activation> act) {
  product_with_epilogue("conv2d", pixel_rows(x), weight_matrix(w, true), y, pixel_rows, bias, residual, act);
}
// dx = dy W
void pointwise_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx) {
  gemm("conv2d_backward_data", pixel_rows(dy), weight_matrix(w, false), pixel_rows(dx));
}
// dW = dy^T x, a sum over the P = N*H*W pixel rows. oneDNN's matmul splits a product's work by
// blocks of its result and not along its sum, so a long sum into a small [O, C] result (ResNet-50
// at 32x32: 65,536 rows, 64 or 256 channels) leaves threads idle or copying. A long sum is
// therefore cut into one chunk per thread: one batched product writes each chunk's partial
// result, and the partials are added. The operand with fewer channels is the one read transposed
// (oneDNN copies that operand into its own layout first, so the smaller copy is cheaper): the
// partials are [O, C] = dy^T x when O <= C, else [C, O] = x^T dy, transposed as they are added.
void pointwise_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw) {
  MatrixOperand xr = pixel_rows(x), dyr = pixel_rows(dy);
  const int64_t P = xr.rows, chunks = weight_gradient_chunks(P);
  if (chunks == 1)
    return gemm("conv2d_backward_weight", transposed(dyr), xr, weight_matrix(dw, false));
  const int64_t rows = P / chunks, O = dw.size(0), C = dw.size(1);
  xr.rows = dyr.rows = rows;
  xr.batch_stride = rows * C;
  dyr.batch_stride = rows * O;
  const bool o_first = O <= C;
  const MatrixOperand& a = o_first ? dyr : xr;
  const MatrixOperand& b = o_first ? xr : dyr;
  const Tensor part = Tensor::empty({chunks, a.cols, b.cols});
  gemm_batched("conv2d_backward_weight", chunks, transposed(a), b,
               {part, a.cols, b.cols, b.cols, 1, a.cols * b.cols});
  float* sum = part.data<float>();
  const int64_t n = a.cols * b.cols;
  parallel_for(n, n * chunks, [&](int64_t lo, int64_t hi) {
    for (int64_t k = 1; k < chunks; ++k) {
      const float* pk = sum + k * n;
#pragma omp simd
      for (int64_t i = lo; i < hi; ++i) sum[i] += pk[i];
    }
  });
  const Tensor total = part.select(0, 0);
  cpu_backend().copy(o_first ? total : total.transpose(0, 1), dw.view({O, C}));
}

// y = act(im2col(x) W^T + bias + residual) (planner.h): each output pixel's receptive field times
// the weights, with the epilogue of a pointwise forward.
void im2col_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                    const Conv2dParams& p) {
  const int64_t O = w.size(0), KH = w.size(2), KW = w.size(3), K = KH * KW * w.size(1);
  const int64_t OH = y.size(2), OW = y.size(3), P = y.size(0) * OH * OW;
  const Tensor col = Tensor::empty({P, K}, TensorOptions(x.dtype()));
  im2col_nhwc(x, col, OH, OW, KH, KW, p);
  product_with_epilogue("conv2d", {col, P, K, K, 1}, {ohwi_weights(w), K, O, 1, K}, y, pixel_rows, bias, residual,
                        p.act);
}

void weight_gradient_in_ohwi(const Tensor& dw, const std::function<void(const Tensor& out)>& compute) {
  const Tensor ohwi = dw.permute({0, 2, 3, 1});
  if (ohwi.is_contiguous()) return compute(dw);
  const Tensor out = Tensor::empty({dw.size(0), dw.size(2), dw.size(3), dw.size(1)}, TensorOptions(dw.dtype()));
  compute(out);
  cpu_backend().copy(out, ohwi);
}

// dW = dy^T im2col(x) (planner.h), straight into a channels-last weight gradient (its
// memory is the [O, KH*KW*C] matrix), else through a scratch matrix copied into dw's layout.
void im2col_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Conv2dParams& p) {
  const int64_t O = dw.size(0), C = dw.size(1), KH = dw.size(2), KW = dw.size(3), K = KH * KW * C;
  const int64_t P = dy.size(0) * dy.size(2) * dy.size(3);
  const Tensor col = Tensor::empty({P, K}, TensorOptions(x.dtype()));
  im2col_nhwc(x, col, dy.size(2), dy.size(3), KH, KW, p);
  weight_gradient_in_ohwi(dw, [&](const Tensor& out) {
    gemm("conv2d_backward_weight", transposed(pixel_rows(dy)), {col, P, K, K, 1}, {out, O, K, K, 1});
  });
}


// dx = col2im(dy W) (planner.h): dy's [P, O] pixel rows times the weights as the [O, KH*KW*C]
// matrix (OHWI order: a channels-last weight is that already, any other is copied) give, for each
// output pixel, its contribution to every input pixel of its receptive field, tap by tap, in f32.
// Those are summed onto dx image by image: an image's pixels receive only its own rows, so each
// thread owns whole images and no sum is shared. bf16 sums in an f32 image and rounds once.
void col2im_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  const int64_t O = w.size(0), C = w.size(1), KH = w.size(2), KW = w.size(3), K = KH * KW * C;
  const int64_t N = dy.size(0), OH = dy.size(2), OW = dy.size(3), H = dx.size(2), W = dx.size(3);
  const Tensor wm = ohwi_weights(w);
  const Tensor col = Tensor::empty({N * OH * OW, K}, TensorOptions(DType::f32));
  gemm("conv2d_backward_data", pixel_rows(dy), {wm, O, K, K, 1}, {col, N * OH * OW, K, K, 1});
  const float* cols = col.data<float>();
  const bool bf16 = dx.dtype() == DType::bf16;
  const int64_t image = H * W * C;
  parallel_for(N, N * OH * OW * K, [&](int64_t b, int64_t e) {
    std::vector<float> buffer(bf16 ? static_cast<size_t>(image) : 0);
    for (int64_t n = b; n < e; ++n) {
      float* acc = bf16 ? buffer.data() : static_cast<float*>(dx.raw_data()) + n * image;
      std::memset(acc, 0, static_cast<size_t>(image) * sizeof(float));
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const float* row = cols + ((n * OH + oh) * OW + ow) * K;
          for (int64_t kh = 0; kh < KH; ++kh) {
            const int64_t ih = conv_in_index(oh, kh, p.stride_h, p.pad_h, p.dilation_h);
            if (ih < 0 || ih >= H) continue;
            for (int64_t kw = 0; kw < KW; ++kw) {
              const int64_t iw = conv_in_index(ow, kw, p.stride_w, p.pad_w, p.dilation_w);
              if (iw < 0 || iw >= W) continue;
              float* d = acc + (ih * W + iw) * C;
              const float* s = row + (kh * KW + kw) * C;
#pragma omp simd
              for (int64_t c = 0; c < C; ++c) d[c] += s[c];
            }
          }
        }
      if (bf16) {
        uint16_t* out = static_cast<uint16_t*>(dx.raw_data()) + n * image;
        for (int64_t i = 0; i < image; ++i) out[i] = float_to_bf16(acc[i]);
      }
    }
  });
}

// ---- a KxK kernel over a 1x1 map: the one tap that sees the input ---------------------------------
// x [N, C, 1, 1] and y [N, O, 1, 1] are [N, C] and [N, O] matrices whatever their layout (a 4-D
// tensor's first two sizes and strides); the tap w[:, :, th, tw] is an [O, C] matrix read through
// w's strides, so nothing is copied.
namespace {
// The tap, an [O, C] view through w's strides. oneDNN's matmul runs its reference kernel on
// operands whose inner stride is not 1, so the products read and write a dense copy (O*C elements).
Tensor tap_of(const Tensor& w, const Conv2dParams& p) {
  return w.select(3, p.pad_w / p.dilation_w).select(2, p.pad_h / p.dilation_h);
}
// The dense copy of the tap. A frozen weight's (inference) is kept from one call to the next
// (frozen_copies.h) and frozen itself, so the matrix product also keeps its packed copy of it
// instead of copying and packing the tap at every call.
Tensor dense_tap(const Tensor& w, const Conv2dParams& p) {
  if (!w.is_frozen()) return tap_of(w, p).contiguous();
  const int64_t th = p.pad_h / p.dilation_h, tw = p.pad_w / p.dilation_w;
  char name[64];
  const auto end = fmt::format_to_n(name, sizeof name, "dense tap ({}, {})", th, tw).out;
  return frozen_copy(w, std::string_view(name, static_cast<size_t>(end - name)), [&] {
    const Tensor t = tap_of(w, p).contiguous();
    t.freeze();
    return t;
  });
}
MatrixOperand matrix(const Tensor& m, bool transposed) {
  return transposed ? MatrixOperand{m, m.size(1), m.size(0), m.stride(1), m.stride(0)}
                    : MatrixOperand{m, m.size(0), m.size(1), m.stride(0), m.stride(1)};
}
}  // namespace

// y = act(x W_tap^T + bias + residual); x, y and the residual as [N, C] and [N, O] matrices
void tap_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& residual, const Tensor& y,
                 const Conv2dParams& p) {
  const Tensor tap = dense_tap(w, p);
  product_with_epilogue("conv2d", matrix(x, false), matrix(tap, true), y, [](const Tensor& t) { return matrix(t, false); },
                        bias, residual, p.act);
}
// dx = dy W_tap
void tap_backward_data(const Tensor& dy, const Tensor& w, const Tensor& dx, const Conv2dParams& p) {
  const Tensor tap = dense_tap(w, p);
  gemm("conv2d_backward_data", matrix(dy, false), matrix(tap, false), matrix(dx, false));
}
// dW is zero but at the tap, where it is dy^T x; the bias gradient sums dy over the N rows.
void tap_backward_weight(const Tensor& x, const Tensor& dy, const Tensor& dw, const Tensor& dbias,
                         const Conv2dParams& p) {
  const Tensor tap = Tensor::empty({dw.size(0), dw.size(1)}, TensorOptions(dw.dtype()));
  gemm("conv2d_backward_weight", matrix(dy, true), matrix(x, false), matrix(tap, false));
  cpu_backend().fill(dw, 0.0);
  cpu_backend().copy(tap, tap_of(dw, p));
  if (!dbias.defined()) return;
  const int64_t N = dy.size(0), O = dy.size(1);
  std::vector<float> sums(static_cast<size_t>(O), 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o) {
      const int64_t at = n * dy.stride(0) + o * dy.stride(1);
      sums[static_cast<size_t>(o)] += dy.dtype() == DType::bf16
                                          ? bf16_to_float(static_cast<const uint16_t*>(dy.raw_data())[at])
                                          : static_cast<const float*>(dy.raw_data())[at];
    }
  for (int64_t o = 0; o < O; ++o) {
    const float s = sums[static_cast<size_t>(o)];
    if (dbias.dtype() == DType::bf16) static_cast<uint16_t*>(dbias.raw_data())[o * dbias.stride(0)] = float_to_bf16(s);
    else static_cast<float*>(dbias.raw_data())[o * dbias.stride(0)] = s;
  }
}

}  // namespace duet::cpu
