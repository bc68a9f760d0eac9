// RAII wrappers of the cuDNN descriptors duet uses, so an exception between create and destroy
// leaks nothing, and the descriptor setters with duet's conventions: 4-D tensors described with
// packed NCHW or NHWC strides computed from the shape (cuDNN dislikes the arbitrary strides a
// size-1 dim may carry), and alpha/beta scaling factors of the type cuDNN expects for the dtype.
#pragma once
#include <cudnn.h>
#include <cstdint>
#include "engine/dtype.h"

namespace duet::cuda {

// f32, f64, f16 (CUDNN_DATA_HALF) or bf16 (CUDNN_DATA_BFLOAT16), else duet::Error. Only the
// convolutions receive the 16-bit types: the dispatch refuses them for every other op
// (CudaBackend::support).
cudnnDataType_t cudnn_dtype(const char* op, DType t);
// The compute type of a convolution over dtype t: double for f64, else float. f16/bf16 data with
// float compute is cuDNN's PSEUDO_HALF / PSEUDO_BFLOAT16 configuration: 16-bit inputs and outputs,
// products accumulated in f32.
cudnnDataType_t cudnn_compute_dtype(DType t);

class TensorDesc {
public:
  explicit TensorDesc(const char* op);
  ~TensorDesc();
  TensorDesc(const TensorDesc&) = delete;
  TensorDesc& operator=(const TensorDesc&) = delete;
  operator cudnnTensorDescriptor_t() const { return d_; }
  // A dense [n, c, h, w] tensor, NCHW or channels-last.
  void set(DType t, int64_t n, int64_t c, int64_t h, int64_t w, bool channels_last);

private:
  const char* op_;
  cudnnTensorDescriptor_t d_ = nullptr;
};

class FilterDesc {
public:
  explicit FilterDesc(const char* op);
  ~FilterDesc();
  FilterDesc(const FilterDesc&) = delete;
  FilterDesc& operator=(const FilterDesc&) = delete;
  operator cudnnFilterDescriptor_t() const { return d_; }
  void set(DType t, int64_t k, int64_t c, int64_t h, int64_t w, bool channels_last);

private:
  const char* op_;
  cudnnFilterDescriptor_t d_ = nullptr;
};

class ConvDesc {
public:
  explicit ConvDesc(const char* op);
  ~ConvDesc();
  ConvDesc(const ConvDesc&) = delete;
  ConvDesc& operator=(const ConvDesc&) = delete;
  operator cudnnConvolutionDescriptor_t() const { return d_; }

private:
  const char* op_;
  cudnnConvolutionDescriptor_t d_ = nullptr;
};

class PoolDesc {
public:
  explicit PoolDesc(const char* op);
  ~PoolDesc();
  PoolDesc(const PoolDesc&) = delete;
  PoolDesc& operator=(const PoolDesc&) = delete;
  operator cudnnPoolingDescriptor_t() const { return d_; }

private:
  const char* op_;
  cudnnPoolingDescriptor_t d_ = nullptr;
};

// alpha = 1 and beta = 0 (or 1) in the type cuDNN reads for the dtype: double for f64, float otherwise
// (f16 and bf16 included).
class Scalars {
public:
  explicit Scalars(DType t) : f64_(t == DType::f64) {}
  const void* one() const { return f64_ ? static_cast<const void*>(&d1_) : static_cast<const void*>(&f1_); }
  const void* zero() const { return f64_ ? static_cast<const void*>(&d0_) : static_cast<const void*>(&f0_); }

private:
  bool f64_;
  float f1_ = 1.0f, f0_ = 0.0f;
  double d1_ = 1.0, d0_ = 0.0;
};

}  // namespace duet::cuda
