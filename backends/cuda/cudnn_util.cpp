// cuDNN descriptor wrappers. Destroy calls cannot usefully fail, so their status is ignored.
#include "backends/cuda/cudnn_util.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"
#include "engine/error.h"

namespace duet::cuda {

cudnnDataType_t cudnn_dtype(const char* op, DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: break;
  }
  throw Error(fmt::format("{} on backend 'cuda': dtype {} is not supported, expected f32, f64, f16 or bf16", op,
                          dtype_name(t)));
}

cudnnDataType_t cudnn_compute_dtype(DType t) { return t == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT; }

TensorDesc::TensorDesc(const char* op) : op_(op) { DUET_CUDNN_CHECK(cudnnCreateTensorDescriptor(&d_), op_); }
TensorDesc::~TensorDesc() { (void)cudnnDestroyTensorDescriptor(d_); }

void TensorDesc::set(DType t, int64_t n, int64_t c, int64_t h, int64_t w, bool channels_last) {
  const int N = to_int(op_, "batch size", n), C = to_int(op_, "channels", c), H = to_int(op_, "height", h),
            W = to_int(op_, "width", w);
  // Strides as products of sizes, each size counted at least once so that an empty dim does not
  // produce a zero stride.
  const int64_t C1 = c > 0 ? c : 1, H1 = h > 0 ? h : 1, W1 = w > 0 ? w : 1;
  int64_t sn, sc, sh, sw;
  if (channels_last) sn = H1 * W1 * C1, sc = 1, sh = W1 * C1, sw = C1;
  else sn = C1 * H1 * W1, sc = H1 * W1, sh = W1, sw = 1;
  DUET_CUDNN_CHECK(cudnnSetTensor4dDescriptorEx(d_, cudnn_dtype(op_, t), N, C, H, W, to_int(op_, "batch stride", sn),
                                                to_int(op_, "channel stride", sc), to_int(op_, "row stride", sh),
                                                to_int(op_, "column stride", sw)),
                   op_);
}

FilterDesc::FilterDesc(const char* op) : op_(op) { DUET_CUDNN_CHECK(cudnnCreateFilterDescriptor(&d_), op_); }
FilterDesc::~FilterDesc() { (void)cudnnDestroyFilterDescriptor(d_); }

void FilterDesc::set(DType t, int64_t k, int64_t c, int64_t h, int64_t w, bool channels_last) {
  DUET_CUDNN_CHECK(cudnnSetFilter4dDescriptor(d_, cudnn_dtype(op_, t), channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                              to_int(op_, "output channels", k), to_int(op_, "input channels per group", c),
                                              to_int(op_, "kernel height", h), to_int(op_, "kernel width", w)),
                   op_);
}

ConvDesc::ConvDesc(const char* op) : op_(op) { DUET_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&d_), op_); }
ConvDesc::~ConvDesc() { (void)cudnnDestroyConvolutionDescriptor(d_); }

PoolDesc::PoolDesc(const char* op) : op_(op) { DUET_CUDNN_CHECK(cudnnCreatePoolingDescriptor(&d_), op_); }
PoolDesc::~PoolDesc() { (void)cudnnDestroyPoolingDescriptor(d_); }

}  // namespace duet::cuda
