// Helpers shared by the op front-ends: argument checks that produce actionable messages, the
// backend lookup, and output allocation that keeps the input's dense layout (so channels-last
// activations stay channels-last through elementwise ops, as in PyTorch).
//
// Every kernel is called through Dispatch (engine/ops/dispatch.h), made after the inputs are
// converted (those conversions are copy ops of their own) and before the outputs are allocated.
#pragma once
#include <initializer_list>
#include <string>
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/half.h"
#include "engine/op_cost.h"
#include "engine/ops/dispatch.h"
#include "engine/profiler/events.h"

namespace duet::detail {

inline BackendImpl& backend_of(const Tensor& t) { return backend(t.backend()); }

void check_defined(const char* op, const char* arg, const Tensor& t);
void check_float(const char* op, const char* arg, const Tensor& t);  // f32 or f64
// f32, f64, f16 or bf16: the GEMM-heavy ops (conv2d, linear, matmul) and the ops between them
// (batch norm, activations, elementwise maths, pooling, softmax, concatenation) also run in the two
// mixed-precision dtypes (engine/autocast.h); the others take f32 or f64.
void check_float_or_half(const char* op, const char* arg, const Tensor& t);
// PyTorch's type promotion of two floating dtypes: the wider (f64 > f32 > f16, bf16; f16 with bf16
// gives f32).
DType promote_float(DType a, DType b);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
void check_same(const char* op, const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref);  // device + dtype
void check_dim(const char* op, const char* arg, const Tensor& t, int64_t ndim);
void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected);
// t may be written in place: not frozen (Tensor::freeze).
void check_writable(const char* op, const Tensor& t);

// t without autograd history, for a kernel's operand or a tensor a backward keeps: t itself when
// no history can be recorded from it (grad mode off, or a tensor outside autograd), else
// t.detach(). Inference would otherwise make a new TensorImpl for every operand of every op. An
// op's own output is detached with detach(): it is about to get a history.
inline Tensor untracked(const Tensor& t) {
  return grad_mode_enabled() && t.defined() && (t.requires_grad() || t.grad_fn()) ? t.detach() : t;
}

// An uninitialised tensor of `shape` with t's dtype and device, laid out like t when t is dense
// and has that shape (same stride order), else contiguous.
Tensor empty_like_layout(const Tensor& t, const Shape& shape);
// An uninitialised dense tensor of `shape` whose dims lie in memory in the order of `strides`
// (largest stride outermost): the layout empty_like_layout gives a tensor with those strides.
Tensor empty_in_stride_order(const Shape& shape, const Shape& strides, const TensorOptions& o);
// (The same layout as a view of a given block: view_in_stride_order, engine/tensor.h.)
// t itself when dense, else a contiguous copy.
Tensor dense(const Tensor& t);
// t with exactly ref's strides (a copy when they differ). Shapes must match.
Tensor same_layout(const Tensor& t, const Tensor& ref);
// For conv/pool/norm kernels: t as NCHW-contiguous or channels-last-contiguous, in `f`.
Tensor in_format(const Tensor& t, MemoryFormat f);

// The gradient through an activation: one "<act>.backward" op reading `saved` (the input, or for
// ReLU/ReLU6 the output: the masks agree) and g. Also the first half of the backward of an op with
// a fused ReLU or ReLU6 (conv2d or batch_norm with p.act), which saves its output for it.
Tensor activation_backward_op(Activation act, const Tensor& saved, const Tensor& g, double alpha = 0);

// Broadcast shape of a and b (numpy rules) or a duet::Error naming the op and both shapes.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// A view of t expanded to shape (stride 0 on broadcast dims), outside autograd.
Tensor expand_nograd(const Tensor& t, const Shape& shape);

std::string dims_str(const std::vector<int64_t>& d);

// One copy op from src into the tensor make_dst() returns, which must live on device `to` and have
// src's shape (its dtype may differ: a cast). The destination is made inside the op's window, so a copy
// into a new tensor (contiguous, clone, to, same_layout) counts the new tensor's bytes as its
// own; copy_ hands in the existing tensor. A dtype change on one device is "cast" and a copy
// between devices "copy.device" (ops.def's label): rows of their own in the profiler.
template <class MakeDst>
Tensor copy_into(const Tensor& src, Device to, MakeDst&& make_dst) {
  BackendImpl& be = backend(src.device().type == DeviceType::cuda ? Backend::cuda : default_backend(to.type));
  const bool cross = src.device() != to;
  profiler::PhaseGuard phase(cross ? Phase::copy : profiler::current_phase());
  Dispatch<OpId::copy> kernel(be, {&src});
  Tensor dst = make_dst();
  kernel(src, dst);
  return dst;
}

}  // namespace duet::detail
