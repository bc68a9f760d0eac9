// Profiler events (see events.h): the per-thread event buffers, step and phase marks, the op
// window (OpScope) that every dispatched op opens, and collect(), which merges what they recorded.
#include "engine/profiler/events.h"
#include <algorithm>
#include <charconv>
#include <memory>
#include <mutex>
#include "engine/backend.h"
#include "engine/profiler/device_timer.h"
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

const char* timing_mode_name(TimingMode m) { return m == TimingMode::per_op ? "per-op" : "throughput"; }

const char* backend_label(const OpEvent& e) { return e.transport ? e.transport : backend_name(e.backend); }

namespace profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {
struct ThreadBuffer {
  std::vector<OpEvent> events;
  size_t unresolved_from = 0;  // events before this index carry no pending device markers
  std::vector<PhaseMark> marks;
  std::string name;
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

// Steps happen a few times a second at most: a mutex is fine here.
std::atomic<bool> g_steps_on{false};
std::atomic<TimingMode> g_mode{TimingMode::per_op};
std::mutex g_steps_mu;
std::vector<StepEvent> g_steps;
bool g_step_open = false;
StepEvent g_open_step;

StepEvent::DeviceMemory memory_of(Device d) { return {d, device_allocator(d).stats()}; }

// "[64, 3, 32, 32]" appended in place (shape_str's text, without its temporaries: this runs for
// every input of every recorded op).
void append_shape(std::string& out, const std::vector<int64_t>& shape) {
  out += '[';
  char buf[24];
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) out += ", ";
    const auto r = std::to_chars(buf, buf + sizeof buf, shape[i]);
    out.append(buf, r.ptr);
  }
  out += ']';
}

std::atomic<bool> g_sync_per_op{false};
std::atomic<DeviceTimer*> g_timers[kNumBackends]{};

// A thread that records this many events without a step boundary (one long evaluation pass)
// resolves its markers early, so the marker pool and the span measured from one reference stay
// bounded: one extra synchronisation per this many ops.
constexpr size_t kMaxPendingEvents = 16384;

// The timer that times ops of backend b in per-op mode, or null (host clock).
DeviceTimer* timer_for(Backend b) {
  return g_sync_per_op.load(std::memory_order_relaxed) ? nullptr : g_timers[static_cast<int>(b)].load();
}

// Turns the device markers of the events recorded in b since the last resolution into timestamps.
void resolve_markers(ThreadBuffer& b) {
  if (b.unresolved_from >= b.events.size()) return;
  for (int k = 0; k < kNumBackends; ++k) {
    DeviceTimer* t = g_timers[k].load();
    if (!t) continue;
    std::vector<size_t> which;
    std::vector<int64_t> ids;
    for (size_t i = b.unresolved_from; i < b.events.size(); ++i) {
      const OpEvent& e = b.events[i];
      if (static_cast<int>(e.backend) != k || e.device_begin < 0) continue;
      which.push_back(i);
      ids.push_back(e.device_begin);
      ids.push_back(e.device_end);
    }
    if (ids.empty()) continue;
    const std::vector<int64_t> ns = t->resolve(ids);
    for (size_t j = 0; j < which.size(); ++j) {
      OpEvent& e = b.events[which[j]];
      e.device_begin = e.device_end = -1;
      if (ns[2 * j] < 0 || ns[2 * j + 1] < 0) continue;  // markers lost: keep the host-clock times
      e.start_ns = ns[2 * j];
      e.end_ns = std::max(ns[2 * j + 1], e.start_ns);
      e.device_timed = true;
    }
  }
  b.unresolved_from = b.events.size();
}
}  // namespace

void set_device_timer(Backend b, DeviceTimer* timer) { g_timers[static_cast<int>(b)].store(timer); }
DeviceTimer* device_timer(Backend b) { return g_timers[static_cast<int>(b)].load(); }
void set_sync_per_op(bool on) { g_sync_per_op.store(on); }
bool sync_per_op() { return g_sync_per_op.load(std::memory_order_relaxed); }

void enable(bool on) {
  // enable(false) inside a throughput session (a helper that profiled briefly) returns to it.
  if (on) g_mode.store(TimingMode::per_op);
  else if (g_steps_on.load()) g_mode.store(TimingMode::throughput);
  detail::g_enabled.store(on);
}

void enable_throughput(bool on) {
  if (on) {
    detail::g_enabled.store(false);
    g_mode.store(TimingMode::throughput);
  }
  g_steps_on.store(on);
}

TimingMode timing_mode() { return g_mode.load(); }
bool recording() { return enabled() || g_steps_on.load(std::memory_order_relaxed); }

void clear() {
  {
    std::lock_guard<std::mutex> lk(g_buffers_mu);
    for (auto& b : buffers()) {
      b->events.clear();
      b->unresolved_from = 0;
      b->marks.clear();
    }
  }
  for (auto& t : g_timers)
    if (DeviceTimer* timer = t.load()) timer->discard();
  std::lock_guard<std::mutex> lk(g_steps_mu);
  g_steps.clear();
  g_step_open = false;
}

void step_begin(int64_t step, int64_t images, Device device) {
  if (!recording()) return;
  const int thread = my_buffer().thread;
  std::lock_guard<std::mutex> lk(g_steps_mu);
  DUET_CHECK(!g_step_open, "profiler::step_begin({}): step {} is still open; call profiler::step_end() first",
             step, g_open_step.step);
  g_open_step = StepEvent{};
  g_open_step.step = step;
  g_open_step.images = images;
  g_open_step.thread = thread;
  g_open_step.memory.push_back({device, {}});  // the device; its counters are read at step_end
  g_step_open = true;
  g_open_step.start_ns = now_ns();
  if (device.type != DeviceType::cuda || !enabled()) return;
  if (DeviceTimer* t = timer_for(Backend::cuda)) t->begin_timeline(device);
}

void step_end() {
  {
    std::lock_guard<std::mutex> lk(g_steps_mu);
    if (!g_step_open) return;  // recording was off at step_begin, or clear() ran in between
    // A step on a GPU ends when its queued kernels have run, not when the host returns.
    if (g_open_step.memory.front().device.type == DeviceType::cuda) duet::backend(Backend::cuda).synchronize();
  }
  const int64_t t = now_ns();
  // The device has finished the step (synchronised above), so its markers resolve without a wait.
  resolve_markers(my_buffer());
  std::lock_guard<std::mutex> lk(g_steps_mu);
  if (!g_step_open) return;
  g_step_open = false;
  StepEvent e = std::move(g_open_step);
  e.end_ns = t;
  const Device d = e.memory.front().device;
  e.memory.clear();
  e.memory.push_back(memory_of(Device::cpu()));
  if (d != Device::cpu()) e.memory.push_back(memory_of(d));
  g_steps.push_back(std::move(e));
}

std::vector<StepEvent> collect_steps() {
  std::lock_guard<std::mutex> lk(g_steps_mu);
  return g_steps;
}

std::vector<PhaseMark> collect_phase_marks() {
  std::vector<PhaseMark> all;
  {
    std::lock_guard<std::mutex> lk(g_buffers_mu);
    for (auto& b : buffers()) all.insert(all.end(), b->marks.begin(), b->marks.end());
  }
  std::stable_sort(all.begin(), all.end(), [](const PhaseMark& a, const PhaseMark& b) { return a.t_ns < b.t_ns; });
  return all;
}

void set_thread_name(const std::string& name) {
  ThreadBuffer& b = my_buffer();
  std::lock_guard<std::mutex> lk(g_buffers_mu);
  b.name = name;
}

std::vector<std::pair<int, std::string>> thread_names() {
  std::vector<std::pair<int, std::string>> out;
  std::lock_guard<std::mutex> lk(g_buffers_mu);
  for (auto& b : buffers())
    if (!b->name.empty()) out.emplace_back(b->thread, b->name);
  return out;
}

std::vector<OpEvent> collect() {
  std::vector<OpEvent> all;
  {
    std::lock_guard<std::mutex> lk(g_buffers_mu);
    for (auto& b : buffers()) {
      resolve_markers(*b);
      all.insert(all.end(), b->events.begin(), b->events.end());
    }
  }
  std::stable_sort(all.begin(), all.end(), [](const OpEvent& a, const OpEvent& b) { return a.start_ns < b.start_ns; });
  return all;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Phase current_phase() { return t_phase; }
void set_phase(Phase p) {
  const bool changed = p != t_phase;
  t_phase = p;
  if (changed && recording()) {
    ThreadBuffer& b = my_buffer();
    b.marks.push_back({p, now_ns(), b.thread});
  }
}

const std::string& current_scope() { return t_scope; }

ScopeGuard::ScopeGuard(const std::string& name) : prev_len_(t_scope.size()), active_(enabled() && !name.empty()) {
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

void note_reason(const std::string& why) {
  if (enabled() && !why.empty()) t_impl += (t_impl.empty() ? "[" : " [") + why + "]";
}

void OpScope::begin(const char* name, Backend backend, std::initializer_list<const Tensor*> inputs) {
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
    append_shape(shapes_, t->shape());
  }
  start(name, backend);
}

void OpScope::begin_creation(const char* name, Backend backend, const std::vector<int64_t>& out_shape, DType dtype,
                             Device device) {
  dtype_ = dtype;
  device_ = device;
  append_shape(shapes_, out_shape);
  start(name, backend);
}

void OpScope::start(const char* name, Backend backend) {
  active_ = true;
  name_ = name;
  backend_ = backend;
  t_impl.clear();
  alloc_before_ = thread_allocated_bytes();
  peak_before_ = device_allocator(device_).usage().peak;
  if (DeviceTimer* t = timer_for(backend)) {
    // Asynchronous device: a marker on its stream where the op begins (and one where it ends);
    // the host clock below only orders the event until the markers are resolved.
    ThreadBuffer& b = my_buffer();
    if (b.events.size() - b.unresolved_from >= kMaxPendingEvents) resolve_markers(b);
    mark_begin_ = t->mark(device_);
  } else if (backend == Backend::cuda) {
    // --profile-sync: drain earlier queued work so this op's host clock starts when it can start.
    duet::backend(Backend::cuda).synchronize();
  }
  start_ns_ = now_ns();
}

void OpScope::end() {
  int64_t mark_end = -1;
  if (mark_begin_ >= 0) {
    if (DeviceTimer* t = device_timer(backend_)) mark_end = t->mark(device_);
  } else if (backend_ == Backend::cuda) {
    duet::backend(Backend::cuda).synchronize();
  }
  const int64_t end_ns = now_ns();
  const Allocator::Usage u = device_allocator(device_).usage();
  ThreadBuffer& b = my_buffer();
  OpEvent& e = b.events.emplace_back();
  e.end_ns = end_ns;
  e.start_ns = start_ns_;
  if (mark_end >= 0) {
    e.device_begin = mark_begin_;
    e.device_end = mark_end;
  }
  e.name = name_;
  e.phase = t_phase;
  e.backend = backend_;
  e.dtype = dtype_;
  e.shapes = std::move(shapes_);
  e.scope = t_scope;
  e.impl = std::move(t_impl);
  e.transport = transport_;
  e.flops = flops_;
  e.bytes = bytes_;
  e.bytes_allocated = thread_allocated_bytes() - alloc_before_;
  e.live_bytes = u.current;
  e.peak_bytes = u.peak;
  e.peak_before = peak_before_;
  e.device = device_;
  e.thread = b.thread;
}

}  // namespace profiler
}  // namespace duet
