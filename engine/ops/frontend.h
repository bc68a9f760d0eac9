// Helpers shared by the op front-ends: argument checks that produce actionable messages, the
// backend lookup, and output allocation that keeps the input's dense layout (so channels-last
// activations stay channels-last through elementwise ops, as in PyTorch).
#pragma once
#include <initializer_list>
#include <string>
#include "engine/autocast.h"
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/op_cost.h"
#include "engine/profiler.h"

namespace duet::detail {

inline BackendImpl& backend_of(const Tensor& t) { return backend(t.backend()); }

void check_defined(const char* op, const char* arg, const Tensor& t);
void check_float(const char* op, const char* arg, const Tensor& t);  // f32 or f64
// f32, f64, f16 or bf16: the GEMM-heavy ops (conv2d, linear, matmul) also run in the two
// mixed-precision dtypes (engine/autocast.h); every other op takes f32 or f64 only.
void check_float_or_half(const char* op, const char* arg, const Tensor& t);
void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected);
void check_same(const char* op, const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref);  // device + dtype
void check_dim(const char* op, const char* arg, const Tensor& t, int64_t ndim);
void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected);

// An uninitialised tensor of `shape` with t's dtype and device, laid out like t when t is dense
// and has that shape (same stride order), else contiguous.
Tensor empty_like_layout(const Tensor& t, const Shape& shape);
// t itself when dense, else a contiguous copy.
Tensor dense(const Tensor& t);
// t with exactly ref's strides (a copy when they differ). Shapes must match.
Tensor same_layout(const Tensor& t, const Tensor& ref);
// For conv/pool/norm kernels: t as NCHW-contiguous or channels-last-contiguous, in `f`.
Tensor in_format(const Tensor& t, MemoryFormat f);
// The memory format a 4-D op keeps: channels-last when x is, else contiguous.
MemoryFormat format_of(const Tensor& x);

// Broadcast shape of a and b (numpy rules) or a duet::Error naming the op and both shapes.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);
// A view of t expanded to shape (stride 0 on broadcast dims), outside autograd.
Tensor expand_nograd(const Tensor& t, const Shape& shape);

std::string dims_str(const std::vector<int64_t>& d);

}  // namespace duet::detail
