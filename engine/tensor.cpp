// Tensor handles: creation, metadata, views (which share storage and record autograd nodes),
// copies between layouts, dtypes and devices, and printing.
#include "engine/tensor.h"
#include <algorithm>
#include <array>
#include <cstring>
#include <functional>
#include <numeric>
#include <optional>
#include <sstream>
#include "engine/autograd.h"
#include "engine/backend.h"
#include "engine/functional.h"
#include "engine/op_cost.h"
#include "engine/ops/frontend.h"
#include "engine/profiler/events.h"

namespace duet {

// ---- Storage, generator -------------------------------------------------------------------------
namespace {
std::atomic<uint64_t> g_next_storage_id{1};
std::atomic<uint64_t> g_next_freeze{1};
}  // namespace

Storage::Storage(size_t nbytes, Device dev, Allocator* alloc, MemTag t)
    : bytes(nbytes), device(dev), allocator(alloc), tag(t), id(g_next_storage_id.fetch_add(1)) {
  data = allocator->allocate(nbytes, tag);
}
Storage::~Storage() { allocator->deallocate(data, bytes, tag); }

Generator& default_generator() {
  static Generator g;
  return g;
}
void manual_seed(uint64_t seed) {
  default_generator().seed = seed;
  default_generator().offset = 0;
}

// ---- shape helpers ------------------------------------------------------------------------------
std::string shape_str(const Shape& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

// The dims of a channels-last [N, C, H, W] tensor from innermost to outermost: C, W, H, N. Written
// once, for the strides and for the check (Tensor::is_contiguous).
constexpr std::array<size_t, 4> kChannelsLastInnerFirst{1, 3, 2, 0};

Shape channels_last_strides(const Shape& s) {
  DUET_CHECK(s.size() == 4, "channels-last layout needs a 4-D shape [N, C, H, W], got {}", shape_str(s));
  Shape st(4);
  int64_t acc = 1;
  for (const size_t d : kChannelsLastInnerFirst) {
    st[d] = acc;
    acc *= std::max<int64_t>(s[d], 1);
  }
  return st;
}

Tensor view_in_stride_order(const Tensor& flat, const Shape& shape, const Shape& strides) {
  std::vector<int64_t> order(shape.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return strides[a] > strides[b]; });
  Shape permuted(order.size());
  for (size_t i = 0; i < order.size(); ++i) permuted[i] = shape[order[i]];
  Tensor base = flat.view(permuted);
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[order[i]] = static_cast<int64_t>(i);
  return base.permute(inverse);
}

int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  DUET_CHECK(d >= lo && d <= hi, "{}: dim {} is out of range for a tensor with {} dims (expected {} to {})", op, d,
             ndim, lo, hi);
  return d < 0 ? d + std::max<int64_t>(ndim, 1) : d;
}

// ---- creation ----------------------------------------------------------------------------------
Tensor Tensor::empty(const Shape& shape, TensorOptions o, MemoryFormat f) {
  for (int64_t d : shape)
    DUET_CHECK(d >= 0, "empty(): negative dimension in shape {}", shape_str(shape));
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = f == MemoryFormat::channels_last ? channels_last_strides(shape) : contiguous_strides(shape);
  impl->dtype = o.dtype;
  const size_t bytes = static_cast<size_t>(numel_of(shape)) * dtype_size(o.dtype);
  impl->storage = std::make_shared<Storage>(bytes, o.device, &device_allocator(o.device), current_mem_tag());
  Tensor t(std::move(impl));
  if (o.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor Tensor::full(const Shape& shape, double value, TensorOptions o) {
  const bool rg = o.requires_grad;
  Tensor t;
  {
    detail::Dispatch<OpId::fill> kernel(duet::backend(default_backend(o.device.type)), shape, o.dtype, o.device);
    t = empty(shape, o.with_grad(false));  // the new tensor is the fill's
    kernel(t, value);
  }
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor Tensor::zeros(const Shape& shape, TensorOptions o) { return full(shape, 0.0, o); }
Tensor Tensor::ones(const Shape& shape, TensorOptions o) { return full(shape, 1.0, o); }
Tensor Tensor::scalar(double value, TensorOptions o) { return full({}, value, o); }

Tensor Tensor::arange(int64_t n, TensorOptions o) {
  std::vector<double> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.0);
  return from_vector(v, {n}, o);
}

static Tensor random_tensor(const Shape& shape, TensorOptions o, Generator* g, bool normal) {
  const bool rg = o.requires_grad;
  const char* name = normal ? "randn" : "rand";
  DUET_CHECK(o.dtype == DType::f32 || o.dtype == DType::f64, "{}: argument 'dtype' has dtype {}, expected f32 or f64",
             name, dtype_name(o.dtype));
  Generator& gen = g ? *g : default_generator();
  BackendImpl& be = backend(default_backend(o.device.type));
  Tensor t;
  // The new tensor is the op's: it is allocated inside the op's window.
  if (normal) {
    detail::Dispatch<OpId::normal> kernel(be, shape, o.dtype, o.device);
    t = Tensor::empty(shape, o.with_grad(false));
    kernel(t, 0.0, 1.0, gen.seed, gen.reserve(static_cast<uint64_t>(t.numel()) * 2));
  } else {
    detail::Dispatch<OpId::uniform> kernel(be, shape, o.dtype, o.device);
    t = Tensor::empty(shape, o.with_grad(false));
    kernel(t, 0.0, 1.0, gen.seed, gen.reserve(static_cast<uint64_t>(t.numel())));
  }
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor Tensor::rand(const Shape& shape, TensorOptions o, Generator* g) { return random_tensor(shape, o, g, false); }
Tensor Tensor::randn(const Shape& shape, TensorOptions o, Generator* g) { return random_tensor(shape, o, g, true); }

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& v, const Shape& shape, TensorOptions o) {
  DUET_CHECK(static_cast<int64_t>(v.size()) == numel_of(shape),
             "from_vector(): {} values given for shape {} which holds {}", v.size(), shape_str(shape), numel_of(shape));
  Tensor host = empty(shape, TensorOptions(dtype_of<T>::value));
  if (!v.empty()) std::memcpy(host.raw_data(), v.data(), v.size() * sizeof(T));
  Tensor t = host;
  if (o.dtype != dtype_of<T>::value) t = t.to(o.dtype);
  if (o.device != Device::cpu()) t = t.to(o.device);
  if (o.requires_grad) t.set_requires_grad(true);
  return t;
}
template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&, TensorOptions);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&, TensorOptions);
template Tensor Tensor::from_vector<int64_t>(const std::vector<int64_t>&, const Shape&, TensorOptions);
template Tensor Tensor::from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, TensorOptions);
template Tensor Tensor::from_vector<uint8_t>(const std::vector<uint8_t>&, const Shape&, TensorOptions);

Tensor Tensor::empty_like(const Tensor& t) { return detail::empty_like_layout(t, t.shape()); }
Tensor Tensor::zeros_like(const Tensor& t) {
  Tensor z = empty_like(t);
  z.zero_();
  return z;
}

// ---- metadata ----------------------------------------------------------------------------------
#define DUET_NEED_DEFINED(what) DUET_CHECK(impl_ != nullptr, "{}: the tensor is undefined", what)

const Shape& Tensor::shape() const { DUET_NEED_DEFINED("shape()"); return impl_->shape; }
const Shape& Tensor::strides() const { DUET_NEED_DEFINED("strides()"); return impl_->strides; }
int64_t Tensor::dim() const { return static_cast<int64_t>(shape().size()); }
int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size()")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride()")]; }
int64_t Tensor::numel() const { return numel_of(shape()); }
int64_t Tensor::offset() const { DUET_NEED_DEFINED("offset()"); return impl_->offset; }
DType Tensor::dtype() const { DUET_NEED_DEFINED("dtype()"); return impl_->dtype; }
Device Tensor::device() const { DUET_NEED_DEFINED("device()"); return impl_->storage->device; }
const std::shared_ptr<Storage>& Tensor::storage() const { DUET_NEED_DEFINED("storage()"); return impl_->storage; }
void* Tensor::raw_data() const {
  return static_cast<char*>(storage()->data) + offset() * static_cast<int64_t>(dtype_size(dtype()));
}

// These two run several times per op (the front ends and the backends ask them of every operand),
// so they compare strides as they go instead of allocating the expected strides or a sorted copy:
// batch-1 inference pays every per-op cost like this on every layer.
bool Tensor::is_contiguous(MemoryFormat f) const {
  const Shape& sh = shape();
  const Shape& st = strides();
  const auto matches = [&](size_t d, int64_t& expected) {  // size-1 dims may have any stride
    const bool ok = sh[d] == 1 || st[d] == expected;
    expected *= std::max<int64_t>(sh[d], 1);
    return ok;
  };
  int64_t expected = 1;
  if (f == MemoryFormat::channels_last) {
    if (sh.size() != 4) return false;
    for (const size_t d : kChannelsLastInnerFirst)
      if (!matches(d, expected)) return false;
    return true;
  }
  for (size_t d = sh.size(); d-- > 0;)
    if (!matches(d, expected)) return false;
  return true;
}

int64_t channel_row_stride(const Tensor& t) {
  if (!t.defined() || t.dim() != 4) return 0;
  const int64_t N = t.size(0), C = t.size(1), H = t.size(2), W = t.size(3);
  if (C > 1 && t.stride(1) != 1) return 0;
  // The row stride: W's stride, else H's over W, else N's over H * W (size-1 dims have any stride).
  const int64_t s = W > 1 ? t.stride(3) : H > 1 ? t.stride(2) / W : N > 1 ? t.stride(0) / (H * W) : C;
  if (s < C) return 0;
  if ((W > 1 && t.stride(3) != s) || (H > 1 && t.stride(2) != W * s) || (N > 1 && t.stride(0) != H * W * s)) return 0;
  return s;
}

bool Tensor::is_dense() const {
  // Sort the non-trivial dims by stride: dense iff each stride equals the product of the sizes
  // of the dims inner to it. An insertion sort into a fixed array (tensors have a few dims).
  const Shape& sh = shape();
  const Shape& st = strides();
  using StrideSize = std::pair<int64_t, int64_t>;
  std::array<StrideSize, 8> inline_dims;
  std::vector<StrideSize> many_dims(sh.size() > inline_dims.size() ? sh.size() : 0);
  StrideSize* sd = many_dims.empty() ? inline_dims.data() : many_dims.data();
  size_t n = 0;
  for (size_t i = 0; i < sh.size(); ++i) {
    if (sh[i] == 0) return true;
    if (sh[i] == 1) continue;
    const StrideSize d{st[i], sh[i]};
    size_t j = n++;
    for (; j > 0 && sd[j - 1] > d; --j) sd[j] = sd[j - 1];
    sd[j] = d;
  }
  int64_t expected = 1;
  for (size_t k = 0; k < n; ++k) {
    if (sd[k].first != expected) return false;
    expected *= sd[k].second;
  }
  return true;
}

MemoryFormat Tensor::suggest_memory_format() const {
  if (dim() == 4 && !is_contiguous() && is_contiguous(MemoryFormat::channels_last)) return MemoryFormat::channels_last;
  return MemoryFormat::contiguous;
}

// ---- autograd fields ---------------------------------------------------------------------------
bool Tensor::requires_grad() const { return impl_ && impl_->requires_grad; }

Tensor& Tensor::set_requires_grad(bool r) {
  DUET_NEED_DEFINED("set_requires_grad()");
  DUET_CHECK(!impl_->grad_fn, "set_requires_grad() on a non-leaf tensor (the output of '{}'): call detach() first",
             impl_->grad_fn->name);
  DUET_CHECK(!r || dtype() == DType::f32 || dtype() == DType::f64,
             "set_requires_grad(true) on a tensor of dtype {}: only f32 and f64 tensors can require grad",
             dtype_name(dtype()));
  impl_->requires_grad = r;
  return *this;
}

Tensor Tensor::grad() const { DUET_NEED_DEFINED("grad()"); return impl_->grad; }
void Tensor::set_grad(const Tensor& g) const {
  DUET_NEED_DEFINED("set_grad()");
  DUET_CHECK(!g.defined() || g.shape() == shape(), "set_grad(): gradient of shape {} for a tensor of shape {}",
             shape_str(g.shape()), shape_str(shape()));
  impl_->grad = g;
}
void Tensor::zero_grad() const { DUET_NEED_DEFINED("zero_grad()"); impl_->grad = Tensor(); }
const std::shared_ptr<Node>& Tensor::grad_fn() const { DUET_NEED_DEFINED("grad_fn()"); return impl_->grad_fn; }
bool Tensor::is_leaf() const { return !grad_fn(); }

Tensor Tensor::detach() const {
  DUET_NEED_DEFINED("detach()");
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = impl_->storage;
  impl->shape = impl_->shape;
  impl->strides = impl_->strides;
  impl->offset = impl_->offset;
  impl->dtype = impl_->dtype;
  return Tensor(std::move(impl));
}

void Tensor::backward(const Tensor& grad, bool retain_graph) const { run_backward(*this, grad, retain_graph); }

// ---- views -------------------------------------------------------------------------------------
// A view shares storage; when the base requires grad it records a node whose backward maps the
// view's gradient back to the base's shape.
static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset, const char* name,
                        std::function<Tensor(const Tensor&)> grad_to_base) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  Tensor v(std::move(impl));
  if (should_record({&base})) {
    record(name, {&base}, {&v}, [fn = std::move(grad_to_base)](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{fn(g[0])};
    });
  }
  return v;
}

static Shape infer_shape(const Shape& requested, int64_t numel, const char* op) {
  Shape s = requested;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      DUET_CHECK(infer < 0, "{}: only one dimension can be -1, got {}", op, shape_str(requested));
      infer = static_cast<int64_t>(i);
    } else {
      DUET_CHECK(s[i] >= 0, "{}: invalid dimension {} in {}", op, s[i], shape_str(requested));
      known *= s[i];
    }
  }
  if (infer >= 0) {
    DUET_CHECK(known != 0 && numel % known == 0, "{}: shape {} is invalid for a tensor of {} elements", op,
               shape_str(requested), numel);
    s[infer] = numel / known;
  }
  DUET_CHECK(numel_of(s) == numel, "{}: shape {} holds {} elements, the tensor has {}", op, shape_str(requested),
             numel_of(s), numel);
  return s;
}

// Strides that let `shape` view memory laid out as (old_shape, old_strides), or empty when no
// such strides exist (PyTorch's rule: merged dims must be contiguous with each other).
static std::optional<Shape> view_strides(const Shape& old_shape, const Shape& old_strides, const Shape& shape) {
  if (numel_of(old_shape) == 0 || old_shape.empty()) return contiguous_strides(shape);
  Shape st(shape.size());
  int64_t view_d = static_cast<int64_t>(shape.size()) - 1;
  int64_t chunk_base_stride = old_strides.empty() ? 1 : old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t d = static_cast<int64_t>(old_shape.size()) - 1; d >= 0; --d) {
    tensor_numel *= old_shape[d];
    if (d == 0 || (old_shape[d - 1] != 1 && old_strides[d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || shape[view_d] == 1)) {
        st[view_d] = view_numel * chunk_base_stride;
        view_numel *= shape[view_d];
        view_d--;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (d > 0) {
        chunk_base_stride = old_strides[d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return st;
}

Tensor Tensor::view(const Shape& requested) const {
  const Shape s = infer_shape(requested, numel(), "view");
  auto st = view_strides(shape(), strides(), s);
  DUET_CHECK(st.has_value(),
             "view: cannot view a tensor of shape {} with strides {} as {}: the dims to merge are not contiguous in "
             "memory; use reshape() (which copies) or contiguous() first",
             shape_str(shape()), shape_str(strides()), shape_str(s));
  const Shape in_shape = shape();
  return make_view(*this, s, *st, offset(), "view", [in_shape](const Tensor& g) { return g.reshape(in_shape); });
}

Tensor Tensor::reshape(const Shape& requested) const {
  const Shape s = infer_shape(requested, numel(), "reshape");
  if (view_strides(shape(), strides(), s)) return view(s);
  return contiguous().view(s);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  DUET_CHECK(static_cast<int64_t>(dims.size()) == dim(), "permute: {} dims given for a tensor with {} dims",
             dims.size(), dim());
  Shape s(dims.size()), st(dims.size());
  std::vector<int64_t> inverse(dims.size(), -1);
  for (size_t i = 0; i < dims.size(); ++i) {
    const int64_t d = wrap_dim(dims[i], dim(), "permute");
    DUET_CHECK(inverse[d] < 0, "permute: dim {} appears twice in {}", d, detail::dims_str(dims));
    inverse[d] = static_cast<int64_t>(i);
    s[i] = shape()[d];
    st[i] = strides()[d];
  }
  return make_view(*this, s, st, offset(), "permute", [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::transpose(int64_t a, int64_t b) const {
  std::vector<int64_t> p(static_cast<size_t>(dim()));
  std::iota(p.begin(), p.end(), 0);
  std::swap(p[wrap_dim(a, dim(), "transpose")], p[wrap_dim(b, dim(), "transpose")]);
  return permute(p);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  d = wrap_dim(d, dim(), "slice");
  DUET_CHECK(step > 0, "slice: step must be positive, got {}", step);
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape s = shape(), st = strides();
  s[d] = (end - start + step - 1) / step;
  st[d] *= step;
  const Shape in_shape = shape(), in_strides = strides();
  const DType dt = dtype();
  return make_view(*this, s, st, offset() + start * strides()[d], "slice", [=](const Tensor& g) {
    // Laid out like the sliced tensor: when that is a permuted view (q, k and v of attention,
    // slices of [3, N, H, S, Dh] permuted from the qkv linear's [N, S, 3, H, Dh]), the gradient
    // then permutes back into the linear's contiguous layout, and its reshape needs no copy.
    Tensor full = detail::empty_in_stride_order(in_shape, in_strides, TensorOptions(dt).with_device(g.device()));
    full.zero_();
    full.slice(d, start, end, step).copy_(g);
    return full;
  });
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  d = wrap_dim(d, dim(), "select");
  const int64_t n = shape()[d];
  DUET_CHECK(index >= -n && index < n, "select: index {} is out of range for dim {} of size {}", index, d, n);
  if (index < 0) index += n;
  return slice(d, index, index + 1).squeeze(d);
}

Tensor Tensor::expand(const Shape& requested) const {
  DUET_CHECK(static_cast<int64_t>(requested.size()) >= dim(), "expand: cannot expand shape {} to fewer dims {}",
             shape_str(shape()), shape_str(requested));
  const size_t lead = requested.size() - shape().size();
  Shape s(requested.size()), st(requested.size());
  for (size_t i = 0; i < requested.size(); ++i) {
    if (i < lead) {
      DUET_CHECK(requested[i] >= 0, "expand: new leading dim {} must be given explicitly", i);
      s[i] = requested[i];
      st[i] = 0;
      continue;
    }
    const int64_t have = shape()[i - lead];
    const int64_t want = requested[i] == -1 ? have : requested[i];
    DUET_CHECK(have == want || have == 1, "expand: shape {} cannot be expanded to {} (dim {} is {}, not 1)",
               shape_str(shape()), shape_str(requested), i - lead, have);
    s[i] = want;
    st[i] = (have == want) ? strides()[i - lead] : 0;
  }
  const Shape in_shape = shape();
  return make_view(*this, s, st, offset(), "expand", [in_shape](const Tensor& g) { return sum_to(g, in_shape); });
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap_dim(d, dim() + 1, "unsqueeze");
  Shape s = shape(), st = strides();
  const int64_t inner = d < dim() ? strides()[d] * shape()[d] : 1;
  s.insert(s.begin() + d, 1);
  st.insert(st.begin() + d, inner);
  const Shape in_shape = shape();
  return make_view(*this, s, st, offset(), "unsqueeze", [in_shape](const Tensor& g) { return g.reshape(in_shape); });
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap_dim(d, dim(), "squeeze");
  if (shape()[d] != 1) return *this;
  Shape s = shape(), st = strides();
  s.erase(s.begin() + d);
  st.erase(st.begin() + d);
  const Shape in_shape = shape();
  return make_view(*this, s, st, offset(), "squeeze", [in_shape](const Tensor& g) { return g.reshape(in_shape); });
}

Tensor Tensor::flatten(int64_t start, int64_t end) const {
  if (dim() == 0) return reshape({1});
  start = wrap_dim(start, dim(), "flatten");
  end = wrap_dim(end, dim(), "flatten");
  DUET_CHECK(start <= end, "flatten: start dim {} is after end dim {}", start, end);
  Shape s(shape().begin(), shape().begin() + start);
  int64_t m = 1;
  for (int64_t i = start; i <= end; ++i) m *= shape()[i];
  s.push_back(m);
  s.insert(s.end(), shape().begin() + end + 1, shape().end());
  return reshape(s);
}

// ---- copies ------------------------------------------------------------------------------------
// The copy kernel runs on the backend of whichever side is not the host, so host<->device
// transfers go through the device's backend.
void Tensor::copy_(const Tensor& src) const {
  DUET_NEED_DEFINED("copy_()");
  detail::check_writable("copy_", *this);
  DUET_CHECK(src.defined(), "copy_(): the source tensor is undefined");
  Tensor s = src;
  if (src.shape() != shape()) {
    detail::broadcast_shapes("copy_", src.shape(), shape());  // validates
    s = detail::expand_nograd(src, shape());
  }
  detail::copy_into(s, device(), [this] { return *this; });
}

void Tensor::freeze() const {
  DUET_NEED_DEFINED("freeze()");
  uint64_t expected = 0;
  storage()->frozen.compare_exchange_strong(expected, g_next_freeze.fetch_add(1));
}
void Tensor::unfreeze() const {
  DUET_NEED_DEFINED("unfreeze()");
  storage()->frozen.store(0);
}
bool Tensor::is_frozen() const { return defined() && storage()->frozen.load() != 0; }
uint64_t Tensor::freeze_number() const { return defined() ? storage()->frozen.load() : 0; }

void Tensor::fill_(double value) const {
  DUET_NEED_DEFINED("fill_()");
  detail::check_writable("fill_", *this);
  detail::Dispatch<OpId::fill> kernel(duet::backend(backend()), {this});
  kernel(*this, value);
}

Tensor Tensor::contiguous(MemoryFormat f) const {
  if (is_contiguous(f)) return *this;
  Tensor out = detail::copy_into(*this, device(), [&] { return empty(shape(), TensorOptions(dtype()).with_device(device()), f); });
  if (should_record({this})) record("contiguous", {this}, {&out}, [](const std::vector<Tensor>& g) { return g; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = detail::copy_into(*this, device(), [&] { return empty_like(*this); });
  if (should_record({this})) record("clone", {this}, {&out}, [](const std::vector<Tensor>& g) { return g; });
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = detail::copy_into(*this, d, [&] {
    return empty(shape(), TensorOptions(dtype()).with_device(d),
                 is_dense() ? suggest_memory_format() : MemoryFormat::contiguous);
  });
  const Device from = device();
  if (should_record({this}))
    record("to_device", {this}, {&out}, [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; });
  return out;
}

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = detail::copy_into(*this, device(), [&] {
    return empty(shape(), TensorOptions(t).with_device(device()),
                 is_dense() ? suggest_memory_format() : MemoryFormat::contiguous);
  });
  const DType from = dtype();
  if (should_record({this}) && is_floating(t))
    record("to_dtype", {this}, {&out}, [from](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0].to(from)}; });
  return out;
}

// ---- values ------------------------------------------------------------------------------------
template <class T>
std::vector<T> Tensor::to_vector() const {
  DUET_NEED_DEFINED("to_vector()");
  Tensor host = detach().to(Device::cpu()).to(dtype_of<T>::value).contiguous();
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;

double Tensor::item() const {
  DUET_NEED_DEFINED("item()");
  DUET_CHECK(numel() == 1, "item(): the tensor has {} elements (shape {}), expected exactly one", numel(),
             shape_str(shape()));
  if (device() == Device::cpu()) {  // read the host value directly: no copy op in the profile
    switch (dtype()) {
      case DType::f32: return *data<float>();
      case DType::f64: return *data<double>();
      case DType::i64: return static_cast<double>(*data<int64_t>());
      case DType::i32: return *data<int32_t>();
      case DType::u8: return *data<uint8_t>();
      default: break;
    }
  }
  return to_vector<double>()[0];
}

std::string Tensor::str(int64_t max_per_dim) const {
  if (!defined()) return "tensor(undefined)";
  const std::vector<double> v = to_vector<double>();
  const Shape& s = shape();
  const bool integral = !is_floating(dtype());
  std::ostringstream os;
  os << "tensor(";
  // Prints dim `d` starting at flat index `base`, eliding the middle of long dims.
  std::function<void(size_t, int64_t, int)> rec = [&](size_t d, int64_t base, int indent) {
    if (d == s.size()) {
      if (integral)
        os << fmt::format("{}", static_cast<int64_t>(v[base]));
      else
        os << fmt::format("{:.4f}", v[base]);
      return;
    }
    int64_t inner = 1;
    for (size_t k = d + 1; k < s.size(); ++k) inner *= s[k];
    os << '[';
    for (int64_t i = 0; i < s[d]; ++i) {
      if (s[d] > 2 * max_per_dim && i == max_per_dim) {
        os << "...";
        i = s[d] - max_per_dim - 1;
        os << (d + 1 == s.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
        continue;
      }
      rec(d + 1, base + i * inner, indent + 1);
      if (i + 1 < s[d]) os << (d + 1 == s.size() ? ", " : ",\n" + std::string(indent + 1, ' '));
    }
    os << ']';
  };
  rec(0, 0, 7);
  os << ", dtype=" << dtype_name(dtype()) << ", shape=" << shape_str(s);
  if (device() != Device::cpu()) os << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad";
  os << ')';
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace duet
