#include "engine/profiler.h"
#include <algorithm>
#include <memory>
#include <mutex>
#include "engine/backend.h"
#include "engine/tensor.h"

namespace duet {

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::optimizer: return "optimizer";
    case Phase::data: return "data";
    case Phase::copy: return "copy";
    case Phase::comm: return "comm";
    case Phase::other: return "other";
  }
  return "?";
}

namespace profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {
struct ThreadBuffer {
  std::vector<OpEvent> events;
  int thread = 0;
};
// Buffers outlive their threads (shared ownership), so events of finished loader threads stay.
std::mutex g_buffers_mu;
std::vector<std::shared_ptr<ThreadBuffer>>& buffers() {
  static std::vector<std::shared_ptr<ThreadBuffer>> b;
  return b;
}
ThreadBuffer& my_buffer() {
  thread_local std::shared_ptr<ThreadBuffer> mine = [] {
    auto b = std::make_shared<ThreadBuffer>();
    std::lock_guard<std::mutex> lk(g_buffers_mu);
    b->thread = static_cast<int>(buffers().size());
    buffers().push_back(b);
    return b;
  }();
  return *mine;
}
thread_local Phase t_phase = Phase::other;
thread_local std::string t_scope;
thread_local std::string t_impl;
}  // namespace

void enable(bool on) { detail::g_enabled.store(on); }

void clear() {
  std::lock_guard<std::mutex> lk(g_buffers_mu);
  for (auto& b : buffers()) b->events.clear();
}

std::vector<OpEvent> collect() {
  std::vector<OpEvent> all;
  {
    std::lock_guard<std::mutex> lk(g_buffers_mu);
    for (auto& b : buffers()) all.insert(all.end(), b->events.begin(), b->events.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const OpEvent& a, const OpEvent& b) { return a.start_ns < b.start_ns; });
  return all;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Phase current_phase() { return t_phase; }
void set_phase(Phase p) { t_phase = p; }

const std::string& current_scope() { return t_scope; }

ScopeGuard::ScopeGuard(const std::string& name) : prev_len_(t_scope.size()), active_(!name.empty()) {
  if (!active_) return;
  if (!t_scope.empty()) t_scope += '.';
  t_scope += name;
}
ScopeGuard::~ScopeGuard() {
  if (active_) t_scope.resize(prev_len_);
}

ScopeReplace::ScopeReplace(const std::string& path) : active_(enabled()) {
  if (!active_) return;
  prev_ = t_scope;
  t_scope = path;
}
ScopeReplace::~ScopeReplace() {
  if (active_) t_scope = prev_;
}

void note_impl(const std::string& impl) {
  if (enabled()) t_impl = impl;
}

void OpScope::begin(const char* name, Backend backend, std::initializer_list<const Tensor*> inputs) {
  active_ = true;
  name_ = name;
  backend_ = backend;
  bool first = true;
  for (const Tensor* t : inputs) {
    if (!t || !t->defined()) continue;
    if (first) {
      dtype_ = t->dtype();
      device_ = t->device();
      first = false;
    } else {
      shapes_ += ' ';
    }
    shapes_ += shape_str(t->shape());
  }
  t_impl.clear();
  alloc_before_ = device_allocator(device_).stats().allocated_total;
  start_ns_ = now_ns();
}

void OpScope::end() {
  OpEvent e;
  e.end_ns = now_ns();
  e.start_ns = start_ns_;
  e.name = name_;
  e.phase = t_phase;
  e.backend = backend_;
  e.dtype = dtype_;
  e.shapes = std::move(shapes_);
  e.scope = t_scope;
  e.impl = std::move(t_impl);
  e.flops = flops_;
  e.bytes = bytes_;
  const MemoryStats s = device_allocator(device_).stats();
  e.bytes_allocated = s.allocated_total - alloc_before_;
  e.live_bytes = s.current;
  e.peak_bytes = s.peak;
  ThreadBuffer& b = my_buffer();
  e.thread = b.thread;
  b.events.push_back(std::move(e));
}

}  // namespace profiler
}  // namespace duet
