#include "engine/ops/frontend.h"
#include <algorithm>
#include <numeric>

namespace duet::detail {

void check_defined(const char* op, const char* arg, const Tensor& t) {
  DUET_CHECK(t.defined(), "{}: argument '{}' is an undefined tensor", op, arg);
}

void check_float(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  DUET_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64,
             "{}: argument '{}' has dtype {}, expected f32 or f64", op, arg, dtype_name(t.dtype()));
}

void check_float_or_half(const char* op, const char* arg, const Tensor& t) {
  check_defined(op, arg, t);
  DUET_CHECK(is_floating(t.dtype()), "{}: argument '{}' has dtype {}, expected f32, f64, f16 or bf16", op, arg,
             dtype_name(t.dtype()));
}

DType promote_float(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::f64 || b == DType::f64) return DType::f64;
  return DType::f32;  // f32 with a 16-bit type, or f16 with bf16
}

void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected) {
  check_defined(op, arg, t);
  DUET_CHECK(t.dtype() == expected, "{}: argument '{}' has dtype {}, expected {}", op, arg, dtype_name(t.dtype()),
             dtype_name(expected));
}

void check_same(const char* op, const char* arg, const Tensor& t, const char* ref_arg, const Tensor& ref) {
  check_defined(op, arg, t);
  DUET_CHECK(t.device() == ref.device(), "{}: argument '{}' is on {}, but '{}' is on {}: expected all on one device",
             op, arg, t.device().str(), ref_arg, ref.device().str());
  DUET_CHECK(t.dtype() == ref.dtype(), "{}: argument '{}' has dtype {}, but '{}' has dtype {}: expected the same dtype",
             op, arg, dtype_name(t.dtype()), ref_arg, dtype_name(ref.dtype()));
}

void check_dim(const char* op, const char* arg, const Tensor& t, int64_t ndim) {
  check_defined(op, arg, t);
  DUET_CHECK(t.dim() == ndim, "{}: argument '{}' has shape {} ({} dims), expected {} dims", op, arg,
             shape_str(t.shape()), t.dim(), ndim);
}

void check_writable(const char* op, const Tensor& t) {
  DUET_CHECK(!t.is_frozen(),
             "{}: the tensor of shape {} is frozen for inference (Tensor::freeze, nn::Module::freeze), so it cannot be "
             "written; unfreeze() it first",
             op, shape_str(t.shape()));
}

void check_shape(const char* op, const char* arg, const Tensor& t, const Shape& expected) {
  check_defined(op, arg, t);
  DUET_CHECK(t.shape() == expected, "{}: argument '{}' has shape {}, expected {}", op, arg, shape_str(t.shape()),
             shape_str(expected));
}

Tensor empty_in_stride_order(const Shape& shape, const Shape& strides, const TensorOptions& o) {
  return view_in_stride_order(Tensor::empty({numel_of(shape)}, o), shape, strides);
}

Tensor empty_like_layout(const Tensor& t, const Shape& shape) {
  const TensorOptions o = TensorOptions(t.dtype()).with_device(t.device());
  bool broadcast = false;  // an expanded view has no memory order of its own to copy
  for (int64_t d = 0; d < t.dim(); ++d) broadcast = broadcast || (t.size(d) > 1 && t.stride(d) == 0);
  if (shape != t.shape() || broadcast || t.is_contiguous()) return Tensor::empty(shape, o);
  if (t.is_contiguous(MemoryFormat::channels_last)) return Tensor::empty(shape, o, MemoryFormat::channels_last);
  // Any other permutation, and views with gaps (a channel slice of an NHWC map): dense in t's
  // stride order, so that a kernel reading t and writing the result walks both in the same order.
  // (A slice given NCHW strides made DenseNet's gradient sums walk rows of 2 elements.)
  return empty_in_stride_order(shape, t.strides(), o);
}

Tensor dense(const Tensor& t) { return t.is_dense() ? t : t.contiguous(); }

Tensor same_layout(const Tensor& t, const Tensor& ref) {
  if (t.strides() == ref.strides()) return t;
  return copy_into(untracked(t), ref.device(), [&] {
    Tensor out = empty_like_layout(ref, ref.shape());
    if (out.strides() != ref.strides()) out = Tensor::empty(ref.shape(), TensorOptions(ref.dtype()).with_device(ref.device()));
    return out;
  });
}

Tensor in_format(const Tensor& t, MemoryFormat f) { return t.is_contiguous(f) ? t : t.contiguous(f); }

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const size_t n = std::max(a.size(), b.size());
  Shape out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DUET_CHECK(da == db || da == 1 || db == 1,
               "{}: shapes {} and {} cannot be broadcast together (dim {} is {} vs {}; expected equal or 1)", op,
               shape_str(a), shape_str(b), i, da, db);
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Tensor expand_nograd(const Tensor& t, const Shape& shape) {
  NoGradGuard no_grad;
  return t.expand(shape);
}

std::string dims_str(const std::vector<int64_t>& d) { return shape_str(d); }

}  // namespace duet::detail
