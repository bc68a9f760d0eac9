// Elementwise kernels: unary maths, tensor-scalar ops, broadcasting binary ops, activations and
// their derivatives, and conv2d's per-channel bias (also in f16/bf16, for autocast). Dense operands are walked as one flat span (the
// op contract gives them equal strides); binary ops walk the output's index space through each
// operand's strides, stride 0 where an operand broadcasts. The maths is kernel_math.h's.
#include "backends/cuda/kernels_common.cuh"

namespace duet::cuda::kern {

namespace {

// The op is a kernel argument rather than a template parameter: the branch is uniform across the
// grid, costs nothing next to the memory traffic, and keeps one instantiation per dtype.
template <class T>
__global__ void unary_kernel(UnaryOp op, const T* x, T* out, int64_t n) {
  DUET_GRID_STRIDE(i, n) out[i] = math::apply_unary(op, x[i]);
}

template <class T>
__global__ void scalar_kernel(ScalarOp op, const T* x, T s, T* out, int64_t n) {
  DUET_GRID_STRIDE(i, n) out[i] = math::apply_scalar(op, x[i], s);
}

template <class T>
__global__ void binary_flat_kernel(BinaryOp op, const T* a, const T* b, T* out, int64_t n) {
  DUET_GRID_STRIDE(i, n) out[i] = math::apply_binary(op, a[i], b[i]);
}

template <class T>
__global__ void binary_strided_kernel(BinaryOp op, const T* a, const T* b, T* out, OffsetCalc<3> calc, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    int64_t off[3];
    calc.offsets(i, off);
    out[off[0]] = math::apply_binary(op, a[off[1]], b[off[2]]);
  }
}

template <class T>
__global__ void activation_kernel(Activation act, T alpha, const T* x, T* out, int64_t n) {
  DUET_GRID_STRIDE(i, n) out[i] = math::activation_value(act, x[i], alpha);
}

template <class T>
__global__ void activation_backward_kernel(Activation act, T alpha, const T* x, const T* dy, T* dx, int64_t n) {
  DUET_GRID_STRIDE(i, n) dx[i] = dy[i] * math::activation_derivative(act, x[i], alpha);
}

template <class T>
__global__ void channel_bias_kernel(T* y, Dims4 Y, const T* bias, int64_t n) {
  DUET_GRID_STRIDE(i, n) {
    // Row-major (n, c, h, w) index -> element offset through Y's strides.
    int64_t r = i;
    const int64_t w = r % Y.W;
    r /= Y.W;
    const int64_t h = r % Y.H;
    r /= Y.H;
    const int64_t c = r % Y.C;
    const int64_t nn = r / Y.C;
    T& out = y[nn * Y.sN + c * Y.sC + h * Y.sH + w * Y.sW];
    out = narrow<T>(widen(out) + widen(bias[c]));  // f16/bf16 add in float, rounded once
  }
}

}  // namespace

cudaError_t unary(UnaryOp op, DType dt, const void* x, void* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, unary_kernel<T><<<grid(n), math::kBlock, 0, s>>>(op, static_cast<const T*>(x), static_cast<T*>(out), n));
  return launched();
}

cudaError_t scalar_op(ScalarOp op, DType dt, const void* x, double scalar, void* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, scalar_kernel<T><<<grid(n), math::kBlock, 0, s>>>(op, static_cast<const T*>(x),
                                                                          static_cast<T>(scalar), static_cast<T*>(out), n));
  return launched();
}

cudaError_t binary(BinaryOp op, DType dt, const void* a, const void* b, void* out, const OffsetCalc<3>& calc, int64_t n,
                   cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, {
    const T* pa = static_cast<const T*>(a);
    const T* pb = static_cast<const T*>(b);
    T* po = static_cast<T*>(out);
    if (is_flat(calc)) binary_flat_kernel<T><<<grid(n), math::kBlock, 0, s>>>(op, pa, pb, po, n);
    else binary_strided_kernel<T><<<grid(n), math::kBlock, 0, s>>>(op, pa, pb, po, calc, n);
  });
  return launched();
}

cudaError_t activation(Activation act, double alpha, DType dt, const void* x, void* out, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, activation_kernel<T><<<grid(n), math::kBlock, 0, s>>>(act, T(alpha), static_cast<const T*>(x),
                                                                                static_cast<T*>(out), n));
  return launched();
}

cudaError_t activation_backward(Activation act, double alpha, DType dt, const void* x, const void* dy, void* dx,
                                int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT(dt, activation_backward_kernel<T><<<grid(n), math::kBlock, 0, s>>>(
                              act, T(alpha), static_cast<const T*>(x), static_cast<const T*>(dy), static_cast<T*>(dx), n));
  return launched();
}

cudaError_t add_channel_bias(DType dt, void* y, const Dims4& Y, const void* bias, cudaStream_t s) {
  const int64_t n = Y.N * Y.C * Y.H * Y.W;
  if (n <= 0) return cudaSuccess;
  DUET_DISPATCH_FLOAT_OR_HALF(dt, channel_bias_kernel<T><<<grid(n), math::kBlock, 0, s>>>(static_cast<T*>(y), Y, static_cast<const T*>(bias), n));
  return launched();
}

}  // namespace duet::cuda::kern
