// Memory ops on the host: fill, copy (with dtype casts and broadcasting), the counter-based random
// fills and concat. Each is one strided walk over the output in scalar C++; the compiler may
// vectorise the innermost dimension when its strides are 1.
#include <cmath>
#include <numbers>
#include <type_traits>
#include "engine/half.h"
#include "backends/reference/loops.h"
#include "backends/reference/reference_backend.h"
#include "engine/rng.h"

namespace duet {
using namespace ref;

void ReferenceBackend::fill(const Tensor& out, double value) {
  dispatch_any(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = narrow<T>(value);
    T* o = ptr<T>(out);
    for_each_offset<1>(out.shape(), {out.strides()}, [&](int64_t i) { o[i] = v; });
  });
}

void ReferenceBackend::copy(const Tensor& src, const Tensor& dst) {
  DUET_CHECK(src.device().type == DeviceType::cpu && dst.device().type == DeviceType::cpu,
             "copy between {} and {} needs the cuda backend; the reference backend only reaches host memory",
             src.device().str(), dst.device().str());
  DUET_CHECK(src.dim() == dst.dim(), "copy on backend 'reference': src has shape {} but dst has shape {}",
             shape_str(src.shape()), shape_str(dst.shape()));
  dispatch_any(dst.dtype(), [&](auto dst_tag) {
    using D = decltype(dst_tag);
    dispatch_any(src.dtype(), [&](auto src_tag) {
      using S = decltype(src_tag);
      D* d = ptr<D>(dst);
      const S* s = ptr<S>(src);
      for_each_offset<2>(dst.shape(), {dst.strides(), src.strides()},
                         [&](int64_t od, int64_t os) { d[od] = convert<D>(s[os]); });
    });
  });
}

// out[i] = lo + (hi - lo) * u_i, u_i = uniform01(seed, offset + i), i in row-major order.
void ReferenceBackend::uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) {
  dispatch_float(out.dtype(), "uniform", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T lo_t = static_cast<T>(lo), hi_t = static_cast<T>(hi);
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      T v = static_cast<T>(lo + (hi - lo) * uniform01(seed, offset + static_cast<uint64_t>(i)));
      // u < 1 always, but rounding to T (f32 especially) can land exactly on hi; keep [lo, hi).
      if (lo_t < hi_t && !(v < hi_t)) v = std::nextafter(hi_t, lo_t);
      o[i] = v;
    }
  });
}

// Box-Muller with two counters per element: u1 = uniform01(seed, offset + 2i), u2 at 2i + 1. Only
// the cosine branch is used, so element i depends on nothing but its own two counters. 1 - u1 is
// in (0, 1], so the log is finite.
void ReferenceBackend::normal(const Tensor& out, double mean, double stddev, uint64_t seed, uint64_t offset) {
  dispatch_float(out.dtype(), "normal", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const int64_t n = out.numel();
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t c = offset + 2 * static_cast<uint64_t>(i);
      const double u1 = uniform01(seed, c), u2 = uniform01(seed, c + 1);
      const double z = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
      o[i] = static_cast<T>(mean + stddev * z);
    }
  });
}

// Each input lands in the slab of out that starts at the running position along dim. Pure data
// movement, so every dtype is accepted.
void ReferenceBackend::concat(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& out) {
  dispatch_any(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = ptr<T>(out);
    int64_t start = 0;
    for (const Tensor& in : inputs) {
      const T* x = ptr<T>(in);
      T* slab = o + start * out.stride(dim);
      for_each_offset<2>(in.shape(), {out.strides(), in.strides()}, [&](int64_t oo, int64_t ox) { slab[oo] = x[ox]; });
      start += in.size(dim);
    }
  });
}

}  // namespace duet
