// The bucketed gradient all-reduce (see grad_reducer.h). Buckets are host buffers: a bucket's
// gradients are copied in when they are final (during backward, on the training thread), summed
// across ranks in place by the communication thread, and copied back divided by the world size
// in finish().
#include "dist/grad_reducer.h"
#include <cstring>
#include <fmt/format.h>
#include "engine/allocator.h"
#include "engine/error.h"
#include "engine/profiler.h"

namespace duet::dist {

namespace {
template <class T>
void copy_in(const Tensor& g, T* dst) {
  Tensor h = g.device().type == DeviceType::cpu ? g : g.to(Device::cpu());
  h = h.contiguous();
  std::memcpy(dst, h.data<T>(), static_cast<size_t>(h.numel()) * sizeof(T));
}

// Writes n = param.numel() averaged values into the parameter's gradient (made when the rank had
// none), in the gradient's own layout and device.
template <class T>
void copy_out(const Tensor& param, const T* src) {
  Tensor g = param.grad();
  if (!g.defined()) {
    MemTagGuard tag(MemTag::gradient);
    g = Tensor::empty_like(param);
    param.set_grad(g);
  }
  if (g.device().type == DeviceType::cpu && g.is_contiguous()) {
    std::memcpy(g.data<T>(), src, static_cast<size_t>(g.numel()) * sizeof(T));
    return;
  }
  Tensor tmp = Tensor::empty(g.shape(), TensorOptions(g.dtype()));
  std::memcpy(tmp.data<T>(), src, static_cast<size_t>(g.numel()) * sizeof(T));
  g.copy_(tmp);
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
  for (Bucket& b : buckets_) {
    const auto n = static_cast<size_t>(b.elements) + b.slots.size();
    if (b.dtype == DType::f32) b.f32.assign(n, 0.0f);
    else b.f64.assign(n, 0.0);
    b.pending = b.slots.size();
  }
  if (opt_.overlap && comm_.thread_safe() && comm_.size() > 1) thread_ = std::thread(&GradReducer::comm_loop, this);
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
  const auto n = static_cast<size_t>(slot.param.numel());
  if (g.defined())
    DUET_CHECK(g.dtype() == b.dtype && g.shape() == slot.param.shape(),
               "data-parallel training: gradient of dtype {} shape {} for a parameter of dtype {} shape {}",
               dtype_name(g.dtype()), shape_str(g.shape()), dtype_name(b.dtype), shape_str(slot.param.shape()));
  if (b.dtype == DType::f32) {
    float* dst = b.f32.data() + slot.offset;
    if (g.defined()) copy_in(g, dst);
    else std::fill(dst, dst + n, 0.0f);
    b.f32[flag] = g.defined() ? 1.0f : 0.0f;
  } else {
    double* dst = b.f64.data() + slot.offset;
    if (g.defined()) copy_in(g, dst);
    else std::fill(dst, dst + n, 0.0);
    b.f64[flag] = g.defined() ? 1.0 : 0.0;
  }
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
  const double bytes = static_cast<double>(b.dtype == DType::f32 ? b.f32.size() * sizeof(float) : b.f64.size() * sizeof(double));
  const double n = comm_.size();
  profiler::PhaseGuard phase(Phase::comm);
  profiler::OpScope op("comm.all_reduce", Backend::reference, {}, [bytes, n] { return OpCost{0.0, 2.0 * (n - 1) / n * bytes}; });
  if (b.dtype == DType::f32) comm_.all_reduce_sum(b.f32.data(), b.f32.size());
  else comm_.all_reduce_sum(b.f64.data(), b.f64.size());
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
  profiler::OpScope op("comm.wait", Backend::reference, {}, [] { return OpCost{}; });
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
  const double world = comm_.size();
  for (Bucket& b : buckets_) {
    for (size_t k = 0; k < b.slots.size(); ++k) {
      Slot& slot = slots_[b.slots[k]];
      slot.ready = false;
      const size_t flag = static_cast<size_t>(b.elements) + k;
      const bool any = b.dtype == DType::f32 ? b.f32[flag] > 0 : b.f64[flag] > 0;
      if (!any) continue;  // no rank had a gradient: the optimizer skips it, as in one process
      const auto n = static_cast<size_t>(slot.param.numel());
      if (b.dtype == DType::f32) {
        float* v = b.f32.data() + slot.offset;
        for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(v[i] / world);
        copy_out(slot.param, v);
      } else {
        double* v = b.f64.data() + slot.offset;
        for (size_t i = 0; i < n; ++i) v[i] /= world;
        copy_out(slot.param, v);
      }
    }
    b.pending = b.slots.size();
  }
}

}  // namespace duet::dist
