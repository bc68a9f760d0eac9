// The bucketed gradient all-reduce (see grad_reducer.h). Buckets are host tensors: a bucket's
// gradients are copied into views of it when they are final (during backward, on the training
// thread; copy_ handles any layout and device), summed across ranks in place by the communication
// thread, divided by the world size and copied back in finish().
#include "distributed/grad_reducer.h"
#include <fmt/format.h>
#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/functional.h"
#include "engine/tensor.h"
#include "engine/profiler/events.h"

namespace duet::dist {

namespace {
// Element i of a bucket's buffer (a flag or a gradient value), whatever its dtype.
double get(const Tensor& buffer, size_t i) {
  return buffer.dtype() == DType::f32 ? static_cast<double>(buffer.data<float>()[i]) : buffer.data<double>()[i];
}
void set(const Tensor& buffer, size_t i, double v) {
  if (buffer.dtype() == DType::f32) buffer.data<float>()[i] = static_cast<float>(v);
  else buffer.data<double>()[i] = v;
}
// A parameter's place in its bucket, as a view shaped like the parameter and laid out as it is:
// a channels-last weight's gradient (Module::to) goes in and out as one block, not transposed.
// Every rank runs the same layout (the memory format is one of the settings compared at start).
Tensor view_in(const Tensor& buffer, int64_t offset, const Tensor& param) {
  return view_in_stride_order(buffer.slice(0, offset, offset + param.numel()), param.shape(), param.strides());
}
// The sums become averages (in double, as one process's mean would be formed).
template <class T>
void divide(T* v, size_t n, double by) {
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(v[i] / by);
}
}  // namespace

GradReducer::GradReducer(Communicator& comm, const std::vector<Tensor>& params, GradReducerOptions options)
    : comm_(comm), opt_(options) {
  DUET_CHECK(opt_.bucket_mb > 0 && opt_.bucket_mb <= 1e6, "--bucket-mb {}: expected a size in MB in (0, 1e6]",
             opt_.bucket_mb);
  const auto limit = static_cast<int64_t>(opt_.bucket_mb * 1e6);
  // Reverse registration order: the last layers' gradients are final first in backward.
  for (auto it = params.rbegin(); it != params.rend(); ++it) {
    const Tensor& p = *it;
    if (!p.requires_grad()) continue;
    DUET_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64,
               "data-parallel training: a parameter of shape {} has dtype {}; gradients are averaged in f32 or f64 "
               "(keep f32 master weights, as --amp does)",
               shape_str(p.shape()), dtype_name(p.dtype()));
    DUET_CHECK(!slot_of_.count(p.impl()), "data-parallel training: a parameter of shape {} is listed twice",
               shape_str(p.shape()));
    const int64_t bytes = p.numel() * static_cast<int64_t>(dtype_size(p.dtype()));
    if (buckets_.empty() || buckets_.back().dtype != p.dtype() ||
        (buckets_.back().elements > 0 &&
         (buckets_.back().elements * static_cast<int64_t>(dtype_size(p.dtype())) + bytes > limit))) {
      buckets_.emplace_back();
      buckets_.back().dtype = p.dtype();
    }
    Bucket& b = buckets_.back();
    slot_of_[p.impl()] = slots_.size();
    b.slots.push_back(slots_.size());
    slots_.push_back({p, buckets_.size() - 1, b.elements, false});
    b.elements += p.numel();
  }
  // The buckets live where the parameters do when the communicator sums there (GPU memory with
  // NCCL), else in host memory.
  for (const Slot& slot : slots_)
    DUET_CHECK(slot.param.device() == slots_.front().param.device(),
               "data-parallel training: parameters on {} and {}; expected one device per rank",
               slots_.front().param.device().str(), slot.param.device().str());
  if (!slots_.empty() && slots_.front().param.device().type != DeviceType::cpu) {
    device_ = slots_.front().param.device();
    DUET_CHECK(comm_.sums_on(device_),
               "data-parallel training on {}: {} cannot sum GPU memory (GPU collectives need NCCL, which this duet was "
               "built without: it comes with the CUDA Toolkit, found when the CUDA backend and MPI are)",
               device_.str(), comm_.describe());
  }
  MemTagGuard tag(MemTag::gradient);
  for (Bucket& b : buckets_) {
    b.buffer = Tensor::zeros({b.elements + static_cast<int64_t>(b.slots.size())}, TensorOptions(b.dtype).with_device(device_));
    b.pending = b.slots.size();
  }
  // GPU buckets overlap backward on the GPU (a communication stream), so no thread is needed.
  if (opt_.overlap && comm_.thread_safe() && comm_.size() > 1 && !on_gpu())
    thread_ = std::thread(&GradReducer::comm_loop, this);
}

GradReducer::~GradReducer() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::vector<GradReducer::BucketInfo> GradReducer::buckets() const {
  std::vector<BucketInfo> v;
  for (const Bucket& b : buckets_) v.push_back({b.slots.size(), b.elements * static_cast<int64_t>(dtype_size(b.dtype))});
  return v;
}

LeafGradHookGuard GradReducer::watch_backward() {
  return LeafGradHookGuard([this](TensorImpl* leaf) { on_leaf_ready(leaf); });
}

void GradReducer::on_leaf_ready(TensorImpl* leaf) {
  const auto it = slot_of_.find(leaf);
  if (it == slot_of_.end()) return;  // an input that requires grad, not a parameter
  DUET_CHECK(!slots_[it->second].ready,
             "data-parallel training: a second backward pass reached a parameter of shape {} before the gradients were "
             "averaged; call finish() after every backward (gradient accumulation is not supported)",
             shape_str(slots_[it->second].param.shape()));
  mark_ready(it->second);
  launch_ready_buckets();
}

void GradReducer::mark_ready(size_t s) {
  Slot& slot = slots_[s];
  Bucket& b = buckets_[slot.bucket];
  const Tensor g = slot.param.grad();
  const size_t flag = static_cast<size_t>(b.elements) + (s - b.slots.front());  // a bucket's slots are consecutive
  if (g.defined())
    DUET_CHECK(g.dtype() == b.dtype && g.shape() == slot.param.shape(),
               "data-parallel training: gradient of dtype {} shape {} for a parameter of dtype {} shape {}",
               dtype_name(g.dtype()), shape_str(g.shape()), dtype_name(b.dtype), shape_str(slot.param.shape()));
  const Tensor dst = view_in(b.buffer, slot.offset, slot.param);
  if (g.defined()) dst.copy_(g);
  else dst.zero_();
  if (on_gpu()) b.buffer.slice(0, static_cast<int64_t>(flag), static_cast<int64_t>(flag) + 1).fill_(g.defined() ? 1.0 : 0.0);
  else set(b.buffer, flag, g.defined() ? 1.0 : 0.0);
  slot.ready = true;
  --b.pending;
}

void GradReducer::launch_ready_buckets() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    const size_t i = next_launch_++;
    if (thread_.joinable()) {
      {
        std::lock_guard lock(mu_);
        queue_.push_back(i);
      }
      cv_.notify_all();
    } else {
      all_reduce(buckets_[i]);
      std::lock_guard lock(mu_);
      ++reduced_;
    }
  }
}

// Profiled as op "comm.all_reduce" in phase comm, on whichever thread runs it: on the
// communication thread its time overlaps backward (the trace shows it on its own row); the
// training thread's exposed wait is "comm.wait" (finish()). Its bytes are the bus bytes of
// nccl-tests, 2 (N - 1) / N times the buffer (what each rank sends and receives in a ring), so
// the op table's GB/s column is the bus bandwidth, comparable across rank counts.
void GradReducer::all_reduce(Bucket& b) {
  const double bytes = static_cast<double>(b.buffer.nbytes());
  const double n = comm_.size();
  profiler::PhaseGuard phase(Phase::comm);
  profiler::CommScope op("comm.all_reduce", comm_.transport(device_), {}, [bytes, n] { return OpCost{0.0, 2.0 * (n - 1) / n * bytes}; });
  const auto count = static_cast<size_t>(b.buffer.numel());
  if (on_gpu()) comm_.start_device_all_reduce_sum(b.buffer.raw_data(), count, b.dtype, device_);  // queued, not waited for
  else if (b.dtype == DType::f32) comm_.all_reduce_sum(b.buffer.data<float>(), count);
  else comm_.all_reduce_sum(b.buffer.data<double>(), count);
}

void GradReducer::comm_loop() {
  profiler::set_thread_name("gradient all-reduce");
  while (true) {
    size_t i = 0;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_ && queue_.empty()) return;
      i = queue_.front();
      queue_.pop_front();
    }
    std::exception_ptr err;
    try {
      all_reduce(buckets_[i]);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard lock(mu_);
      if (err && !error_) error_ = err;
      ++reduced_;
    }
    cv_.notify_all();
  }
}

void GradReducer::finish() {
  // What backward did not hide: the wait for the buckets still in flight, the last ones' all-reduce
  // and the copy of the averages into .grad.
  profiler::PhaseGuard phase(Phase::comm);
  profiler::CommScope op("comm.wait", comm_.transport(device_), {}, [] { return OpCost{}; });
  // Parameters no gradient reached in this pass (unused, or behind an unused branch): final now.
  for (size_t s = 0; s < slots_.size(); ++s)
    if (!slots_[s].ready) mark_ready(s);
  launch_ready_buckets();
  {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return reduced_ == buckets_.size(); });
    reduced_ = 0;
    if (error_) {
      std::exception_ptr e = error_;
      error_ = nullptr;
      std::rethrow_exception(e);
    }
  }
  next_launch_ = 0;
  if (on_gpu()) comm_.wait_device(device_);  // the compute stream waits for the sums, on the GPU
  const double world = comm_.size();
  for (Bucket& b : buckets_) {
    // The "had a gradient" flags on the host (from a GPU bucket: one small copy), and the sums
    // divided in place: on the host in double, on a GPU by one op per bucket.
    const Tensor flags = b.buffer.slice(0, b.elements, b.buffer.numel()).to(Device::cpu());
    if (on_gpu()) {
      const Tensor sums = b.buffer.slice(0, 0, b.elements);
      sums.copy_(mul(sums, 1.0 / world));
    } else if (b.dtype == DType::f32) {
      divide(b.buffer.data<float>(), static_cast<size_t>(b.elements), world);
    } else {
      divide(b.buffer.data<double>(), static_cast<size_t>(b.elements), world);
    }
    for (size_t k = 0; k < b.slots.size(); ++k) {
      Slot& slot = slots_[b.slots[k]];
      slot.ready = false;
      if (get(flags, k) <= 0) continue;  // no rank had a gradient: the optimizer skips it, as in one process
      Tensor g = slot.param.grad();
      if (!g.defined()) {
        MemTagGuard tag(MemTag::gradient);
        g = Tensor::empty_like(slot.param);
        slot.param.set_grad(g);
      }
      g.copy_(view_in(b.buffer, slot.offset, slot.param));
    }
    b.pending = b.slots.size();
  }
}

}  // namespace duet::dist
