// Memory ops on the GPU. Copies between host and device, or between two devices, are one
// cudaMemcpyAsync when both sides are dense with the same layout and dtype; otherwise the data is
// staged through a contiguous buffer and the strided gather kernel (kernels_memory.cu) does the
// layout change and dtype cast on the device. Uploads go through pinned staging blocks and do not
// wait (pinned_staging.h); downloads wait, since the host reads the values next. Fill, concat, the random fills and dropout are kernels.
#include <cmath>
#include <cstring>
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_check.h"

namespace duet {
using namespace cuda;

namespace {

// Dense with the same layout (size-1 dims, whose stride never matters, aside): the two spans then
// match element for element and a byte copy of the span is the whole copy.
bool same_dense_layout(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || !a.is_dense() || !b.is_dense()) return false;
  for (int64_t d = 0; d < a.dim(); ++d)
    if (a.size(d) != 1 && a.stride(d) != b.stride(d)) return false;
  return true;
}

// src (on g's device) gathered into a new contiguous buffer of dtype dt on the same device.
Tensor gather_contiguous(OpGuard& g, const Tensor& src, DType dt) {
  Tensor out = Tensor::empty(src.shape(), TensorOptions(dt).with_device(src.device()));
  const Shape cs = contiguous_strides(src.shape());
  const Shape* st[2] = {&cs, &src.strides()};
  DUET_CUDA_CHECK(kern::copy(dt, out.raw_data(), src.dtype(), src.raw_data(), offset_calc<2>(g.op, src.shape(), st),
                             src.numel(), g.stream()),
                  g.op);
  return out;
}

// dst (on g's device) <- contiguous buffer `buf` on the same device: cast and scattered through dst's strides.
void scatter_contiguous(OpGuard& g, const Tensor& buf, const Tensor& dst) {
  const Shape cs = contiguous_strides(dst.shape());
  const Shape* st[2] = {&dst.strides(), &cs};
  DUET_CUDA_CHECK(kern::copy(dst.dtype(), dst.raw_data(), buf.dtype(), buf.raw_data(), offset_calc<2>(g.op, dst.shape(), st),
                             dst.numel(), g.stream()),
                  g.op);
}

void copy_within_device(const Tensor& src, const Tensor& dst) {
  OpGuard g("copy", dst);
  if (src.dtype() == dst.dtype() && same_dense_layout(src, dst)) {
    DUET_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToDevice, g.stream()), g.op);
    return;
  }
  const Shape* st[2] = {&dst.strides(), &src.strides()};
  DUET_CUDA_CHECK(kern::copy(dst.dtype(), dst.raw_data(), src.dtype(), src.raw_data(), offset_calc<2>(g.op, dst.shape(), st),
                             dst.numel(), g.stream()),
                  g.op);
}

// Pack on the source device (already in dst's dtype), one peer copy, unpack on the destination.
void copy_between_devices(const Tensor& src, const Tensor& dst) {
  Tensor packed;
  {
    OpGuard gs("copy", src);
    packed = src.is_contiguous() && src.dtype() == dst.dtype() ? src : gather_contiguous(gs, src, dst.dtype());
    gs.ctx.synchronize(gs.op);  // the peer copy is queued on the destination's stream
  }
  OpGuard gd("copy", dst);
  Tensor landing = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), TensorOptions(dst.dtype()).with_device(dst.device()));
  DUET_CUDA_CHECK(cudaMemcpyPeerAsync(landing.raw_data(), dst.device().index, packed.raw_data(), src.device().index,
                                      dst.nbytes(), gd.stream()),
                  gd.op);
  if (!landing.same(dst)) scatter_contiguous(gd, landing, dst);
  // `packed` lives on the other device, whose stream knows nothing of this copy: wait before it can be freed.
  gd.ctx.synchronize(gd.op);
}

// `bytes` from host memory to device memory, queued on g's stream. Through a pinned staging block
// the caller's buffer is copied before this returns and nothing waits; a copy too big to stage goes
// from pageable memory and waits for the stream, since the caller may free its buffer next.
void upload(OpGuard& g, void* device, const void* host, size_t bytes) {
  if (StagingBlocks::Lease block = g.ctx.staging().acquire(bytes)) {
    std::memcpy(block.get(), host, bytes);
    DUET_CUDA_CHECK(cudaMemcpyAsync(device, block.get(), bytes, cudaMemcpyHostToDevice, g.stream()), g.op);
    block.queued();
    return;
  }
  DUET_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, g.stream()), g.op);
  g.ctx.synchronize(g.op);
}

void copy_host_to_device(const Tensor& src, const Tensor& dst) {
  OpGuard g("copy", dst);
  if (src.dtype() == dst.dtype() && same_dense_layout(src, dst)) {
    upload(g, dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  // Upload contiguously in the source dtype (broadcasts are materialised on the host), then let
  // the gather kernel cast and lay the values out on the device. `dev` is freed at the end of this
  // scope, after the kernel that reads it was queued: the caching allocator reuses blocks in stream order.
  Tensor staged = src;
  if (!src.is_contiguous()) {
    staged = Tensor::empty(src.shape(), TensorOptions(src.dtype()));
    backend(src.backend()).copy(src, staged);
  }
  Tensor dev = Tensor::empty(src.shape(), TensorOptions(src.dtype()).with_device(dst.device()));
  upload(g, dev.raw_data(), staged.raw_data(), staged.nbytes());
  scatter_contiguous(g, dev, dst);
}

void copy_device_to_host(const Tensor& src, const Tensor& dst) {
  OpGuard g("copy", src);
  if (src.dtype() == dst.dtype() && same_dense_layout(src, dst)) {
    DUET_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(), cudaMemcpyDeviceToHost, g.stream()), g.op);
    g.ctx.synchronize(g.op);
    return;
  }
  const Tensor packed = src.is_contiguous() && src.dtype() == dst.dtype() ? src : gather_contiguous(g, src, dst.dtype());
  const Tensor landing = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), TensorOptions(dst.dtype()));
  DUET_CUDA_CHECK(cudaMemcpyAsync(landing.raw_data(), packed.raw_data(), dst.nbytes(), cudaMemcpyDeviceToHost, g.stream()),
                  g.op);
  g.ctx.synchronize(g.op);  // the host reads the values next
  if (!landing.same(dst)) backend(dst.backend()).copy(landing, dst);
}

}  // namespace

void CudaBackend::fill(const Tensor& out, double value) {
  OpGuard g("fill", out);
  const int64_t n = out.numel();
  if (n == 0) return;
  if (out.is_dense()) {
    // Zero is all-zero bits in every dtype, so memset covers the most common fill.
    if (value == 0.0 && !std::signbit(value)) {
      DUET_CUDA_CHECK(cudaMemsetAsync(out.raw_data(), 0, out.nbytes(), g.stream()), g.op);
      return;
    }
    DUET_CUDA_CHECK(kern::fill(out.dtype(), out.raw_data(), flat_calc(n), n, value, g.stream()), g.op);
    return;
  }
  const Shape* st[1] = {&out.strides()};
  DUET_CUDA_CHECK(kern::fill(out.dtype(), out.raw_data(), offset_calc<1>(g.op, out.shape(), st), n, value, g.stream()), g.op);
}

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  DUET_CHECK(src.shape() == dst.shape(), "copy on backend 'cuda': src has shape {} but dst has shape {}",
             shape_str(src.shape()), shape_str(dst.shape()));
  if (dst.numel() == 0) return;
  const bool src_host = src.device().type == DeviceType::cpu, dst_host = dst.device().type == DeviceType::cpu;
  DUET_CHECK(!(src_host && dst_host), "copy on backend 'cuda': both tensors are on the host; the cpu backend copies those");
  if (src_host) return copy_host_to_device(src, dst);
  if (dst_host) return copy_device_to_host(src, dst);
  if (src.device() == dst.device()) return copy_within_device(src, dst);
  copy_between_devices(src, dst);
}

void CudaBackend::uniform(const Tensor& out, double lo, double hi, uint64_t seed, uint64_t offset) {
  OpGuard g("uniform", out);
  DUET_CHECK(out.is_contiguous(), "uniform on backend 'cuda': out must be contiguous");
  DUET_CUDA_CHECK(kern::uniform(out.dtype(), out.raw_data(), out.numel(), lo, hi, seed, offset, g.stream()), g.op);
}

void CudaBackend::normal(const Tensor& out, double mean, double stddev, uint64_t seed, uint64_t offset) {
  OpGuard g("normal", out);
  DUET_CHECK(out.is_contiguous(), "normal on backend 'cuda': out must be contiguous");
  DUET_CUDA_CHECK(kern::normal(out.dtype(), out.raw_data(), out.numel(), mean, stddev, seed, offset, g.stream()), g.op);
}

// Each input is copied into the slab of out that starts at its running position along dim, walked
// with out's strides (plan_concat_slab): out may be contiguous or channels-last.
void CudaBackend::concat(const std::vector<Tensor>& inputs, int64_t dim, const Tensor& out) {
  OpGuard g("cat", out);
  DUET_CHECK(out.is_dense(), "cat on backend 'cuda': out must be dense (contiguous or channels-last), got strides {}",
             shape_str(out.strides()));
  const size_t elem = dtype_size(out.dtype());
  int64_t start = 0;
  for (const Tensor& in : inputs) {
    check_on(g.op, "input", in, g.device());
    if (in.numel() > 0) {
      ConcatSlab slab;
      DUET_CHECK(plan_concat_slab(out.strides(), in.shape(), in.strides(), dim, start, slab),
                 "cat on backend 'cuda': input of shape {} has more than {} dims that cannot be merged (strides {}); "
                 "make it contiguous first",
                 shape_str(in.shape()), kMaxDims, shape_str(in.strides()));
      char* dst = static_cast<char*>(out.raw_data()) + slab.out_offset * static_cast<int64_t>(elem);
      DUET_CUDA_CHECK(kern::copy(out.dtype(), dst, in.dtype(), in.raw_data(), slab.calc, in.numel(), g.stream()), g.op);
    }
    start += in.size(dim);
  }
}

void CudaBackend::dropout(const Tensor& x, const Tensor& y, const Tensor& mask, double p, uint64_t seed, uint64_t offset) {
  OpGuard g("dropout", x);
  DUET_CHECK(x.strides() == y.strides() && x.strides() == mask.strides() && x.is_dense(),
             "dropout on backend 'cuda': x, y and mask must be dense with equal strides");
  DUET_CUDA_CHECK(kern::dropout(x.dtype(), x.raw_data(), y.raw_data(), mask.raw_data(), x.numel(), p, seed, offset, g.stream()),
                  g.op);
}

}  // namespace duet
