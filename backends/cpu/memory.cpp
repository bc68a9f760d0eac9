// Memory ops on the cpu backend. fill, the random fills and dtype-casting copies are OpenMP loops
// over a simplified (dims fused, output order) index space with unit-stride inner loops; f32
// copies that change the dimension order (NCHW <-> NHWC, transposes) go to oneDNN's jit reorder.
// Random streams use engine/rng.h element by element, so they equal the reference bit for bit.
#include <cmath>
#include <numbers>
#include <type_traits>
#include "backends/cpu/loops.h"
#include "engine/half.h"
#include "engine/rng.h"

namespace duet {
using namespace cpu;

namespace {

// A strided operand without a Tensor around it (concat writes into slabs of its output).
struct Strided {
  const Shape* shape;
  const Shape* strides;
  DType dtype;
  void* data;
};

bool is_dense_span(const Shape& shape, const Shape& strides) {
  // Non-overlapping and gap-free in some dimension order.
  std::vector<int64_t> order;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] != 1) order.push_back(static_cast<int64_t>(d));
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] < strides[b]; });
  int64_t expect = 1;
  for (int64_t d : order) {
    if (strides[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

bool reorder_ok(const Shape& shape, const Shape& sst, const Shape& dstr) {
  if (shape.size() > DNNL_MAX_NDIMS || shape.empty()) return false;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 1 && (sst[d] <= 0 || dstr[d] <= 0)) return false;  // broadcasting is not a reorder
  return true;
}

struct ReorderEntry {
  dnnl::memory::desc src, dst;
  dnnl::reorder prim;
};

void copy_strided(const Strided& src, const Strided& dst) {
  const Shape& shape = *dst.shape;
  int64_t n = numel_of(shape);
  if (n == 0) return;
  const size_t es = dtype_size(dst.dtype);
  // Same dtype, same layout, dense: one memcpy of the span (split across threads).
  if (src.dtype == dst.dtype && *src.strides == *dst.strides && is_dense_span(shape, *dst.strides)) {
    const char* s = static_cast<const char*>(src.data);
    char* d = static_cast<char*>(dst.data);
    const int64_t bytes = n * static_cast<int64_t>(es);
    parallel_for((bytes + 65535) / 65536, n, [&](int64_t b, int64_t e) {
      const int64_t lo = b * 65536, hi = std::min<int64_t>(e * 65536, bytes);
      std::memcpy(d + lo, s + lo, static_cast<size_t>(hi - lo));
    });
    return;
  }
  const Walk<2> w = simplify<2>(shape, {dst.strides, src.strides});
  // Permuting f32 copies (the inner dim is strided on one side) are what oneDNN's reorder is for.
  if (src.dtype == DType::f32 && dst.dtype == DType::f32 && w.shape.size() >= 2 && (w.st[0].back() != 1 || w.st[1].back() != 1) &&
      reorder_ok(shape, *src.strides, *dst.strides) && n >= 4096) {
    Key key("reorder");
    key.add(shape).add(*src.strides).add(*dst.strides);
    auto e = cached<ReorderEntry>(key, [&] {
      ReorderEntry r;
      r.src = dnnl::memory::desc(to_dims(shape), dt::f32, to_dims(*src.strides));
      r.dst = dnnl::memory::desc(to_dims(shape), dt::f32, to_dims(*dst.strides));
      r.prim = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), r.src, engine(), r.dst));
      return r;
    });
    dnnl::memory ms = mem(e->src, src.data), md = mem(e->dst, dst.data);
    execute(e->prim, {{DNNL_ARG_FROM, ms}, {DNNL_ARG_TO, md}});
    return;
  }
  dispatch_any(dst.dtype, [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_any(src.dtype, [&](auto stag) {
      using S = decltype(stag);
      D* pd = static_cast<D*>(dst.data);
      const S* ps = static_cast<const S*>(src.data);
      for_each_row<2>(w, [&](const std::array<int64_t, 2>& off, int64_t len, const std::array<int64_t, 2>& is) {
        D* d = pd + off[0];
        const S* s = ps + off[1];
        if constexpr (std::is_same_v<D, S>) {
          if (is[0] == 1 && is[1] == 1) {  // rows of a channel slice (cat, its backward): libc's copy
            std::memcpy(d, s, static_cast<size_t>(len) * sizeof(D));
            return;
          }
        }
        if (is[0] == 1 && is[1] == 1) {
          for (int64_t i = 0; i < len; ++i) d[i] = convert<D>(s[i]);
        } else if (is[0] == 1 && is[1] == 0) {
          const D v = convert<D>(s[0]);
          for (int64_t i = 0; i < len; ++i) d[i] = v;
        } else {
          for (int64_t i = 0; i < len; ++i) d[i * is[0]] = convert<D>(s[i * is[1]]);
        }
      });
    });
  });
}

}  // namespace

void CpuBackend::fill(const Tensor& out, double value) {
  dispatch_any(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    const T v = narrow<T>(value);
    T* o = static_cast<T*>(out.raw_data());
    const Walk<1> w = simplify<1>(out.shape(), {&out.strides()});
    for_each_row<1>(w, [&](const std::array<int64_t, 1>& off, int64_t len, const std::array<int64_t, 1>& is) {
      T* d = o + off[0];
      if (is[0] == 1) {
        for (int64_t i = 0; i < len; ++i) d[i] = v;
      } else {
        for (int64_t i = 0; i < len; ++i) d[i * is[0]] = v;
      }
    });
  });
}

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  DUET_CHECK(src.device().type == DeviceType::cpu && dst.device().type == DeviceType::cpu,
             "copy between {} and {} needs the cuda backend; the cpu backend only reaches host memory",
             src.device().str(), dst.device().str());
  DUET_CHECK(src.shape() == dst.shape(), "copy on backend 'cpu': src has shape {} but dst has shape {}",
             shape_str(src.shape()), shape_str(dst.shape()));
  guarded("copy", {&src, &dst}, [&] {
    copy_strided({&src.shape(), &src.strides(), src.dtype(), src.raw_data()},
                 {&dst.shape(), &dst.strides(), dst.dtype(), dst.raw_data()});
  });
}

// out[i] = lo + (hi - lo) * u_i with u_i = uniform01(seed, offset + i): the reference's formula,
// element for element, so the stream does not depend on the thread split.
void CpuBackend::uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) {
  dispatch_float(out.dtype(), "uniform", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T lo_t = static_cast<T>(lo), hi_t = static_cast<T>(hi);
    const T below_hi = std::nextafter(hi_t, lo_t);
    parallel_for(out.numel(), out.numel() * 8, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        T v = static_cast<T>(lo + (hi - lo) * uniform01(seed, offset + static_cast<uint64_t>(i)));
        if (lo_t < hi_t && !(v < hi_t)) v = below_hi;
        o[i] = v;
      }
    });
  });
}

// Box-Muller, cosine branch only, counters offset + 2i and 2i + 1: the reference's formula.
void CpuBackend::normal(const Tensor& out, double mean, double stddev, uint64_t seed, uint64_t offset) {
  dispatch_float(out.dtype(), "normal", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    parallel_for(out.numel(), out.numel() * 32, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const uint64_t c = offset + 2 * static_cast<uint64_t>(i);
        const double u1 = uniform01(seed, c), u2 = uniform01(seed, c + 1);
        const double z = std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * std::numbers::pi * u2);
        o[i] = static_cast<T>(mean + stddev * z);
      }
    });
  });
}

// Each input is copied into its slab of out (a strided view), so a channels-last input lands in
// the contiguous output through the reorder path instead of an element-by-element walk.
void CpuBackend::concat(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& out) {
  guarded("concat", {&out}, [&] {
    char* base = static_cast<char*>(out.raw_data());
    const size_t es = dtype_size(out.dtype());
    int64_t start = 0;
    for (const Tensor& in : inputs) {
      DUET_CHECK(in.dtype() == out.dtype(), "concat on backend 'cpu': input dtype {} differs from output dtype {}",
                 dtype_name(in.dtype()), dtype_name(out.dtype()));
      copy_strided({&in.shape(), &in.strides(), in.dtype(), in.raw_data()},
                   {&in.shape(), &out.strides(), out.dtype(), base + start * out.stride(dim) * static_cast<int64_t>(es)});
      start += in.size(dim);
    }
  });
}

}  // namespace duet
