// Front-ends of cat, split, chunk and unbind. Split, chunk and unbind are views (no kernel); cat
// copies every input into one contiguous output, and its gradient is a set of views of the output
// gradient. The views of split and unbind share one autograd node, whose backward writes every
// part's gradient into its place in one buffer: as separate views (slices), each part's backward
// would fill a zero tensor of the input's size and the engine would add them up (attention's q,
// k and v: three fills and two adds of the whole qkv gradient per layer).
#include "engine/ops/frontend.h"

namespace duet {

using namespace detail;

Tensor cat(const std::vector<Tensor>& xs, int64_t dim) {
  DUET_CHECK(!xs.empty(), "cat: expected at least one tensor, got none");
  const Tensor& first = xs[0];
  check_defined("cat", "tensors[0]", first);
  dim = wrap_dim(dim, first.dim(), "cat");
  Shape out_shape = first.shape();
  out_shape[dim] = 0;
  // A 16-bit tensor among wider floats (ViT's f32 class token before bf16 patch embeddings): all
  // are promoted first, as in binary ops.
  for (size_t i = 0; i < xs.size(); ++i) check_defined("cat", fmt::format("tensors[{}]", i).c_str(), xs[i]);
  for (size_t i = 1; i < xs.size(); ++i) {
    if (is_floating(xs[i].dtype()) && is_floating(first.dtype()) && xs[i].dtype() != first.dtype() &&
        (is_half(xs[i].dtype()) || is_half(first.dtype()))) {
      DType t = first.dtype();
      for (const Tensor& x : xs) t = promote_float(t, x.dtype());
      std::vector<Tensor> same;
      for (const Tensor& x : xs) same.push_back(x.to(t));
      return cat(same, dim);
    }
  }
  for (size_t i = 0; i < xs.size(); ++i) {
    const std::string arg = fmt::format("tensors[{}]", i);
    check_same("cat", arg.c_str(), xs[i], "tensors[0]", first);
    DUET_CHECK(xs[i].dim() == first.dim(), "cat: {} has {} dims, tensors[0] has {}: expected the same rank", arg,
               xs[i].dim(), first.dim());
    for (int64_t d = 0; d < first.dim(); ++d)
      DUET_CHECK(d == dim || xs[i].size(d) == first.size(d),
                 "cat: {} has shape {}, tensors[0] has {}: sizes must match except on dim {}", arg,
                 shape_str(xs[i].shape()), shape_str(first.shape()), dim);
    out_shape[dim] += xs[i].size(dim);
  }
  // Channels-last inputs give a channels-last output, so a DenseNet stays in the layout its
  // convolutions run fastest in.
  bool all_cl = first.dim() == 4;
  for (const Tensor& t : xs) all_cl = all_cl && t.suggest_memory_format() == MemoryFormat::channels_last;
  std::vector<Tensor> inputs;
  inputs.reserve(xs.size());
  for (const Tensor& t : xs) inputs.push_back(untracked(t));
  Tensor out;
  {
    Dispatch<OpId::concat> kernel(backend_of(first), {&first});
    out = Tensor::empty(out_shape, TensorOptions(first.dtype()).with_device(first.device()),
                        all_cl ? MemoryFormat::channels_last : MemoryFormat::contiguous);
    kernel(inputs, dim, out);
  }
  bool any = false;
  for (const Tensor& t : xs) any = any || t.requires_grad();
  if (any && grad_mode_enabled()) {
    std::vector<int64_t> sizes;
    for (const Tensor& t : xs) sizes.push_back(t.size(dim));
    record("cat", xs, {&out}, [sizes, dim](const std::vector<Tensor>& gs) {
      std::vector<Tensor> r;
      int64_t off = 0;
      for (int64_t s : sizes) {
        r.push_back(gs[0].slice(dim, off, off + s));
        off += s;
      }
      return r;
    });
  }
  return out;
}

namespace {
// Records the parts of x along dim as the outputs of one node. region(full, i) is part i's view of
// a tensor shaped like x; together the regions cover it.
void record_parts(const Tensor& x, std::vector<Tensor>& parts, const char* name,
                  std::function<Tensor(const Tensor&, size_t)> region) {
  if (parts.empty() || !should_record({&x})) return;
  std::vector<Tensor*> outs;
  for (Tensor& p : parts) outs.push_back(&p);
  const Shape shape = x.shape(), strides = x.strides();
  const TensorOptions o = TensorOptions(x.dtype()).with_device(x.device());
  record(name, {x}, outs, [shape, strides, o, region](const std::vector<Tensor>& gs) {
    // Laid out like x, so that a permuted x (attention's qkv) gets a gradient that permutes back
    // to contiguous. Unused parts come in as zeros from the engine.
    Tensor full = empty_in_stride_order(shape, strides, o);
    for (size_t i = 0; i < gs.size(); ++i) region(full, i).copy_(gs[i]);
    return std::vector<Tensor>{full};
  });
}
}  // namespace

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  check_defined("split", "input", x);
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    DUET_CHECK(s >= 0, "split: negative size {} in {}", s, dims_str(sizes));
    total += s;
  }
  DUET_CHECK(total == x.size(dim), "split: sizes {} add up to {}, but dim {} has size {}", dims_str(sizes), total, dim,
             x.size(dim));
  std::vector<Tensor> parts;
  std::vector<int64_t> starts;
  {
    NoGradGuard no_grad;
    int64_t off = 0;
    for (int64_t s : sizes) {
      parts.push_back(x.slice(dim, off, off + s));
      starts.push_back(off);
      off += s;
    }
  }
  record_parts(x, parts, "split", [starts, sizes, dim](const Tensor& full, size_t i) {
    return full.slice(dim, starts[i], starts[i] + sizes[i]);
  });
  return parts;
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  check_defined("unbind", "input", x);
  dim = wrap_dim(dim, x.dim(), "unbind");
  std::vector<Tensor> parts;
  {
    NoGradGuard no_grad;
    for (int64_t i = 0; i < x.size(dim); ++i) parts.push_back(x.select(dim, i));
  }
  record_parts(x, parts, "unbind",
               [dim](const Tensor& full, size_t i) { return full.select(dim, static_cast<int64_t>(i)); });
  return parts;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  DUET_CHECK(chunks >= 1, "chunk: chunks must be >= 1, got {}", chunks);
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t n = x.size(dim), each = (n + chunks - 1) / chunks;
  std::vector<int64_t> sizes;
  for (int64_t off = 0; off < n; off += each) sizes.push_back(std::min(each, n - off));
  return split(x, sizes, dim);
}

}  // namespace duet
