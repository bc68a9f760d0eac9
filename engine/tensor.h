// Tensor: a cheap, refcounted handle on (storage, shape, strides, offset, dtype, device) plus the
// autograd fields. Views share storage; ops that need a particular layout ask for it explicitly.
#pragma once
#include <atomic>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>
#include "engine/allocator.h"
#include "engine/device.h"
#include "engine/dtype.h"
#include "engine/error.h"

namespace duet {

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

// Dense layouts a 4-D activation can have. channels_last is NHWC in memory with NCHW logical
// dims, exactly PyTorch's meaning. A backend may keep its own blocked layout (oneDNN's
// nChw16c) cached on the Storage; outside the backend a tensor is always plainly strided.
enum class MemoryFormat : uint8_t { contiguous, channels_last };

// A refcounted buffer from a device allocator.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  Allocator* allocator = nullptr;
  MemTag tag = MemTag::activation;
  // Unique for the life of the process, unlike `data`, which a later storage may reuse: what caches
  // of this storage's copies are keyed on.
  const uint64_t id;
  // 0 while writable; while frozen (Tensor::freeze), the freeze's number, new at every freeze, so
  // that copies made under an earlier freeze are never taken for the current contents.
  std::atomic<uint64_t> frozen{0};
  Storage(size_t nbytes, Device dev, Allocator* alloc, MemTag t);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
};

// Counter-based random numbers: element i of a draw is a pure function of (seed, offset + i),
// so results do not depend on thread count or backend, and a draw can be replayed.
struct Generator {
  uint64_t seed = 0x5eed;
  uint64_t offset = 0;
  explicit Generator(uint64_t s = 0x5eed) : seed(s) {}
  uint64_t reserve(uint64_t n) { uint64_t o = offset; offset += n; return o; }
};
Generator& default_generator();
void manual_seed(uint64_t seed);

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
  TensorOptions() = default;
  TensorOptions(DType d) : dtype(d) {}  // NOLINT: allows Tensor::zeros(shape, DType::f64)
  TensorOptions with_dtype(DType d) const { auto o = *this; o.dtype = d; return o; }
  TensorOptions with_device(Device d) const { auto o = *this; o.device = d; return o; }
  TensorOptions with_grad(bool r) const { auto o = *this; o.requires_grad = r; return o; }
};

struct TensorImpl;
struct Node;

class Tensor {
public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation -----------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, TensorOptions o = {}, MemoryFormat f = MemoryFormat::contiguous);
  static Tensor zeros(const Shape& shape, TensorOptions o = {});
  static Tensor ones(const Shape& shape, TensorOptions o = {});
  static Tensor full(const Shape& shape, double value, TensorOptions o = {});
  static Tensor scalar(double value, TensorOptions o = {});
  static Tensor arange(int64_t n, TensorOptions o = {});
  static Tensor rand(const Shape& shape, TensorOptions o = {}, Generator* g = nullptr);   // U[0,1)
  static Tensor randn(const Shape& shape, TensorOptions o = {}, Generator* g = nullptr);  // N(0,1)
  // Copies host values; keeps T's dtype unless options name another (then the values are cast).
  template <class T> static Tensor from_vector(const std::vector<T>& v, const Shape& shape) {
    return from_vector(v, shape, TensorOptions(dtype_of<T>::value));
  }
  template <class T> static Tensor from_vector(const std::vector<T>& v, const Shape& shape, TensorOptions o);
  static Tensor empty_like(const Tensor& t);  // same shape, dtype, device; keeps a dense layout
  static Tensor zeros_like(const Tensor& t);

  // ---- metadata -----------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t dim() const;
  int64_t size(int64_t d) const;    // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const;
  int64_t offset() const;
  DType dtype() const;
  Device device() const;
  Backend backend() const { return default_backend(device().type); }
  bool is_contiguous(MemoryFormat f = MemoryFormat::contiguous) const;
  bool is_dense() const;  // non-overlapping and covers a contiguous span (any permutation)
  MemoryFormat suggest_memory_format() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

  // Typed pointer to element [0,...,0]; checks the dtype.
  template <class T> T* data() const;
  void* raw_data() const;  // pointer to element [0,...,0], untyped

  // ---- values (copy to host) ----------------------------------------------------------------
  double item() const;  // the single value of a one-element tensor
  template <class T> std::vector<T> to_vector() const;
  std::string str(int64_t max_per_dim = 6) const;

  // ---- views: share storage, record autograd -------------------------------------------------
  Tensor view(const Shape& shape) const;     // needs compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // view when possible, else a contiguous copy
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t a, int64_t b) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  Tensor expand(const Shape& shape) const;          // broadcast with stride 0; -1 keeps a dim
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start = 0, int64_t end = -1) const;

  // ---- copies -------------------------------------------------------------------------------
  Tensor contiguous(MemoryFormat f = MemoryFormat::contiguous) const;  // self if already so
  Tensor clone() const;
  Tensor to(Device d) const;
  Tensor to(DType t) const;
  void copy_(const Tensor& src) const;  // in place, no autograd; broadcasts src, casts dtype
  void fill_(double value) const;       // in place, no autograd
  void zero_() const { fill_(0.0); }

  // ---- read-only storage, for inference ------------------------------------------------------
  // freeze() declares the storage read-only until unfreeze(): a backend may then keep a copy of it
  // in its own layout, and autocast its 16-bit copy, across calls instead of making them at every
  // call (an inference model's weights: nn::Module::freeze). Writing a frozen tensor through duet
  // (copy_, fill_, add_, an optimizer step, batch norm's running statistics) is a duet::Error;
  // writing it through a raw pointer is the caller's to avoid.
  void freeze() const;
  void unfreeze() const;
  bool is_frozen() const;
  // The number of the freeze in force (0 when writable): with storage()->id, what a cache of the
  // storage's copies keys on.
  uint64_t freeze_number() const;

  // ---- autograd -----------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& set_requires_grad(bool r);
  Tensor grad() const;  // undefined until a backward pass writes it
  void set_grad(const Tensor& g) const;
  void zero_grad() const;  // drops the gradient
  const std::shared_ptr<Node>& grad_fn() const;
  bool is_leaf() const;
  Tensor detach() const;  // same storage, no history
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

private:
  std::shared_ptr<TensorImpl> impl_;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<Node> grad_fn;  // null for leaves and tensors outside autograd
  int output_nr = 0;              // which output of grad_fn this tensor is
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- helpers used by front-ends and backends ----------------------------------------------------
int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);
Shape channels_last_strides(const Shape& s);  // 4-D only
// For a 4-D tensor laid out as rows of C = size(1) contiguous channels, one row per pixel and
// each row the same number of elements after the last: that number (C for a channels-last
// tensor; more for a slice of a channels-last tensor's channels, as DenseNet's running
// concatenation hands each layer). 0 for any other layout.
int64_t channel_row_stride(const Tensor& t);
int64_t wrap_dim(int64_t d, int64_t ndim, const char* op);  // checks range, names the op
// `flat`, a contiguous 1-D block of exactly numel_of(shape) elements, viewed as a dense tensor of
// `shape` whose dims lie in memory in the order of `strides` (largest stride outermost): a block
// that holds a tensor laid out like one with those strides (a channels-last weight's gradient).
Tensor view_in_stride_order(const Tensor& flat, const Shape& shape, const Shape& strides);

template <class T>
T* Tensor::data() const {
  DUET_CHECK(defined(), "data(): the tensor is undefined");
  DUET_CHECK(dtype() == dtype_of<T>::value, "data<{}>() called on a tensor of dtype {}",
             dtype_name(dtype_of<T>::value), dtype_name(dtype()));
  return static_cast<T*>(storage()->data) + offset();
}

}  // namespace duet
