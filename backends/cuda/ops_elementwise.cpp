// Elementwise ops reach the GPU as duet's own kernels (kernels_elementwise.cu): one pass, one
// thread per element. cuDNN's activation and op-tensor calls would cover only some of these ops
// and none of the PyTorch kink conventions the reference fixes, so nothing here calls a library.
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace duet {
using namespace cuda;

namespace {
// The contract of the flat kernels: x dense and out (and dy/dx) with exactly x's strides.
void check_flat(const char* op, const Tensor& x, const Tensor& out) {
  DUET_CHECK(x.is_dense() && x.strides() == out.strides() && x.shape() == out.shape(),
             "{} on backend 'cuda': expected a dense input and an output with the same strides, got strides {} and {}", op,
             shape_str(x.strides()), shape_str(out.strides()));
}
}  // namespace

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out) {
  OpGuard g(unary_name(op), x);
  check_flat(g.op, x, out);
  DUET_CUDA_CHECK(kern::unary(op, x.dtype(), x.raw_data(), out.raw_data(), x.numel(), g.stream()), g.op);
}

void CudaBackend::scalar_op(ScalarOp op, const Tensor& x, double s, const Tensor& out) {
  OpGuard g(scalar_op_name(op), x);
  check_flat(g.op, x, out);
  DUET_CUDA_CHECK(kern::scalar_op(op, x.dtype(), x.raw_data(), s, out.raw_data(), x.numel(), g.stream()), g.op);
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  OpGuard g(binary_name(op), out);
  check_on(g.op, "a", a, g.device());
  check_on(g.op, "b", b, g.device());
  const Shape* st[3] = {&out.strides(), &a.strides(), &b.strides()};
  DUET_CUDA_CHECK(kern::binary(op, out.dtype(), a.raw_data(), b.raw_data(), out.raw_data(),
                               offset_calc<3>(g.op, out.shape(), st), out.numel(), g.stream()),
                  g.op);
}

void CudaBackend::activation(Activation act, double alpha, const Tensor& x, const Tensor& out) {
  OpGuard g(activation_name(act), x);
  check_flat(g.op, x, out);
  DUET_CUDA_CHECK(kern::activation(act, alpha, x.dtype(), x.raw_data(), out.raw_data(), x.numel(), g.stream()), g.op);
}

void CudaBackend::activation_backward(Activation act, double alpha, const Tensor& x, const Tensor& dy, const Tensor& dx) {
  OpGuard g("activation_backward", x);
  check_flat(g.op, x, dy);
  check_flat(g.op, x, dx);
  DUET_CUDA_CHECK(kern::activation_backward(act, alpha, x.dtype(), x.raw_data(), dy.raw_data(), dx.raw_data(), x.numel(), g.stream()),
                  g.op);
}

}  // namespace duet
