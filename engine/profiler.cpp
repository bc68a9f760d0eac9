#include "engine/profiler.h"
#include <algorithm>
#include <charconv>
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

const char* timing_mode_name(TimingMode m) { return m == TimingMode::per_op ? "per-op" : "throughput"; }

namespace profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {
struct ThreadBuffer {
  // Events in chunks of kChunk, each reserved once: appending never moves earlier events, so a
  // long run has no step that pays for copying all its events into a bigger buffer (a vector's
  // growth), and allocates once per kChunk events (a std::deque of events this size allocates
  // every two).
  static constexpr size_t kChunk = 4096;
  std::vector<std::vector<OpEvent>> events;
  OpEvent& append() {
    if (events.empty() || events.back().size() == kChunk) {
      events.emplace_back();
      events.back().reserve(kChunk);
    }
    return events.back().emplace_back();
  }
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
}  // namespace

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
      b->marks.clear();
    }
  }
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
}

void step_end() {
  {
    std::lock_guard<std::mutex> lk(g_steps_mu);
    if (!g_step_open) return;  // recording was off at step_begin, or clear() ran in between
    // A step on a GPU ends when its queued kernels have run, not when the host returns.
    if (g_open_step.memory.front().device.type == DeviceType::cuda) duet::backend(Backend::cuda).synchronize();
  }
  const int64_t t = now_ns();
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
    for (auto& b : buffers())
      for (const auto& chunk : b->events) all.insert(all.end(), chunk.begin(), chunk.end());
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
  // Per-op timing on an asynchronous device: drain earlier queued work so this op's clock
  // starts when it can start (the per-op mode is labelled as synchronised in reports).
  if (backend == Backend::cuda) duet::backend(Backend::cuda).synchronize();
  start_ns_ = now_ns();
}

void OpScope::end() {
  if (backend_ == Backend::cuda) duet::backend(Backend::cuda).synchronize();
  const int64_t end_ns = now_ns();
  const Allocator::Usage u = device_allocator(device_).usage();
  ThreadBuffer& b = my_buffer();
  OpEvent& e = b.append();
  e.end_ns = end_ns;
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
  e.bytes_allocated = thread_allocated_bytes() - alloc_before_;
  e.live_bytes = u.current;
  e.peak_bytes = u.peak;
  e.peak_before = peak_before_;
  e.device = device_;
  e.thread = b.thread;
}

}  // namespace profiler
}  // namespace duet
