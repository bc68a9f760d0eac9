// Profiler events, recorded by each op's front-end around the op (OpScope) and nowhere else. Off by
// default: then an op pays one relaxed atomic load. On: each dispatched op appends one OpEvent to a per-thread
// buffer (no lock on the hot path); collect() merges the buffers.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>
#include "engine/allocator.h"
#include "engine/device.h"
#include "engine/dtype.h"

namespace duet {

class Tensor;

enum class Phase : uint8_t { forward, backward, optimizer, data, copy, comm, other };
const char* phase_name(Phase p);

struct OpCost {
  double flops = 0;  // floating-point operations (a multiply-add counts 2)
  double bytes = 0;  // minimum bytes moved: every input read once, every output written once
};

struct OpEvent {
  const char* name = "";  // static label: "conv2d", "conv2d.backward_data", ...
  Phase phase = Phase::other;
  Backend backend = Backend::reference;
  DType dtype = DType::f32;
  std::string shapes;  // input shapes, "[64, 3, 32, 32] [16, 3, 3, 3]"
  std::string scope;   // module path ("layer1.0.conv1") at the time the op ran
  std::string impl;    // which implementation ran (oneDNN impl name, cuDNN algorithm), if known
  // A communication window (a collective, or a wait for one; CommScope): who carried it, "mpi" or
  // "nccl". Null for everything a backend computed.
  const char* transport = nullptr;
  int64_t start_ns = 0, end_ns = 0;  // steady clock
  bool device_timed = false;         // start/end are the device's (CUDA events), else host clock reads
  double flops = 0, bytes = 0;
  int64_t bytes_allocated = 0;  // allocated by the op's thread inside the op: outputs, workspace, temporaries
  int64_t live_bytes = 0;       // device memory in use after the op
  int64_t peak_bytes = 0;       // device high-water mark after the op
  int64_t peak_before = 0;      // device high-water mark when the op started (peak_bytes above it: reached inside)
  int thread = 0;
  Device device{};              // where the op's first input lives (whose allocator the bytes are)
  // Device markers (engine/profiler/device_timer.h) awaiting resolution into start_ns/end_ns;
  // -1 once resolved. Events returned by collect() are always resolved.
  int64_t device_begin = -1, device_end = -1;
};

// What the reports' backend column says ran `e`: its backend's name, or for a communication window
// the transport that carried it ("mpi", "nccl"), so communication reads as communication.
const char* backend_label(const OpEvent& e);

// A training step between profiler::step_begin and step_end, on the thread that marked it.
struct StepEvent {
  struct DeviceMemory {
    Device device;
    MemoryStats stats;  // the allocator's counters (current, peak, by tag) at the step's end
  };
  int64_t step = 0;
  int64_t images = 0;  // samples in the step (images/s); 0 when unknown
  int64_t start_ns = 0, end_ns = 0;
  int thread = 0;
  std::vector<DeviceMemory> memory;  // cpu, and the step's device when that is not the cpu
};

// The calling thread entered `phase` at t_ns; it stays there until its next mark.
struct PhaseMark {
  Phase phase = Phase::other;
  int64_t t_ns = 0;
  int thread = 0;
};

// per_op: every op is recorded and timed, so op times add up to the step. Ops of a backend that
// queues work (CUDA) are timed by markers on the device's stream, resolved once per step
// (engine/profiler/device_timer.h), or, with set_sync_per_op(true), by synchronising around each
// op and reading the host clock. throughput: only steps and phase changes are recorded, no
// op events and no per-op synchronisation, so step times are the undisturbed end-to-end times.
enum class TimingMode : uint8_t { per_op, throughput };
const char* timing_mode_name(TimingMode m);  // "per-op", "throughput"

namespace profiler {

namespace detail {
extern std::atomic<bool> g_enabled;
}
inline bool enabled() { return detail::g_enabled.load(std::memory_order_relaxed); }
void enable(bool on = true);       // on: per-op timing mode
void clear();                      // drops all recorded events, steps and phase marks
std::vector<OpEvent> collect();    // all threads' events, sorted by start time
int64_t now_ns();

// Throughput mode: steps and phase marks are recorded, ops are not (enabled() stays false, so
// nothing pays for per-op events or synchronisation). enable(true) switches to per-op mode.
void enable_throughput(bool on = true);
TimingMode timing_mode();  // the mode of the latest enable / enable_throughput
// Per-op timing of asynchronous devices: false (default) uses device markers (CUDA events) and one
// synchronisation per step; true synchronises before and after every op and times it on the host
// clock (host-side timing that includes launch overhead; `duet train --profile-sync`).
void set_sync_per_op(bool on);
bool sync_per_op();
bool recording();          // ops or steps are being recorded

// Step boundaries, called by the trainer around each step; no-ops unless recording(). `device`
// is where the step computes: its allocator's counters are kept with the step (cpu always). On a
// CUDA device step_begin starts the device timeline and step_end waits for the device once and
// turns the step's device markers into timestamps.
// A step_begin while a step is open throws duet::Error (clear() forgets the open step).
void step_begin(int64_t step, int64_t images = 0, Device device = Device::cpu());
void step_end();
std::vector<StepEvent> collect_steps();        // in the order they ended
std::vector<PhaseMark> collect_phase_marks();  // all threads, sorted by time
// Names the calling thread in traces ("loader worker 2"); threads are numbered otherwise.
void set_thread_name(const std::string& name);
std::vector<std::pair<int, std::string>> thread_names();  // (OpEvent.thread, name) of named threads

Phase current_phase();
void set_phase(Phase p);
class PhaseGuard {
public:
  explicit PhaseGuard(Phase p) : prev_(current_phase()) { set_phase(p); }
  ~PhaseGuard() { set_phase(prev_); }
  PhaseGuard(const PhaseGuard&) = delete;
  PhaseGuard& operator=(const PhaseGuard&) = delete;
private:
  Phase prev_;
};

// Module path of the code now running (nn::Module pushes its name around forward).
const std::string& current_scope();
class ScopeGuard {
public:
  explicit ScopeGuard(const std::string& name);  // appends ".name" (or sets it when empty)
  ~ScopeGuard();
  ScopeGuard(const ScopeGuard&) = delete;
  ScopeGuard& operator=(const ScopeGuard&) = delete;
private:
  size_t prev_len_;
  bool active_;
};
// Replaces the whole path (autograd uses it to attribute backward ops to the forward's module).
class ScopeReplace {
public:
  explicit ScopeReplace(const std::string& path);
  ~ScopeReplace();
  ScopeReplace(const ScopeReplace&) = delete;
  ScopeReplace& operator=(const ScopeReplace&) = delete;
private:
  std::string prev_;
  bool active_;
};

// A backend names the implementation it picked for the op in flight ("brg:avx512_core").
void note_impl(const std::string& impl);
// ... and why it picked it (its planner's reason), shown after the implementation in brackets:
// "jit_wino_4x3:avx512_core [winograd: 3x3 stride 1, 64->64 channels >= 32, output 32x32 >= 4x4]".
void note_reason(const std::string& why);

// One op's window: opened before the op's outputs are allocated, closed when the kernel returns.
// The op's time, the bytes its thread allocated (outputs, workspace, temporaries) and the memory
// peak it reached all belong to this window. Off, the constructor is one relaxed atomic load and
// set_cost() a test of a member; the cost functor runs only when profiling is on. Kernels get
// theirs from engine/ops/dispatch.h; other windows (the loader's wait) open one directly, and
// communication opens a CommScope (below):
//
//   profiler::OpScope op("data.wait", Backend::reference, {}, [] { return OpCost{}; });
class OpScope {
public:
  OpScope(const char* name, Backend backend, std::initializer_list<const Tensor*> inputs) {
    if (enabled()) begin(name, backend, inputs);
  }
  // For ops that allocate nothing (in-place kernels, the optimizers, a wait): open and cost at once.
  template <class CostFn>
  OpScope(const char* name, Backend backend, std::initializer_list<const Tensor*> inputs, CostFn&& cost)
      : OpScope(name, backend, inputs) {
    set_cost(cost);
  }
  // For ops that create their output (a filled or random new tensor): described by the output
  // they are about to allocate, since they have no input.
  OpScope(const char* name, Backend backend, const std::vector<int64_t>& out_shape, DType dtype, Device device) {
    if (enabled()) begin_creation(name, backend, out_shape, dtype, device);
  }
  // Names the op once its kernel's arguments are known (engine/ops/dispatch.h evaluates ops.def's
  // label then); the name is read only when the scope ends.
  void set_name(const char* name) { name_ = name; }
  template <class CostFn>
  void set_cost(CostFn&& cost) {
    if (!active_) return;
    const OpCost c = cost();
    flops_ = c.flops;
    bytes_ = c.bytes;
  }
  // Marks the window as communication carried by `transport` (see CommScope).
  void set_transport(const char* transport) { transport_ = transport; }
  ~OpScope() {
    if (active_) end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

private:
  void begin(const char* name, Backend backend, std::initializer_list<const Tensor*> inputs);
  void begin_creation(const char* name, Backend backend, const std::vector<int64_t>& out_shape, DType dtype,
                      Device device);
  void start(const char* name, Backend backend);
  void end();
  bool active_ = false;
  int64_t mark_begin_ = -1;  // device marker where the op began (-1: timed on the host clock)
  const char* name_ = nullptr;
  Backend backend_{};
  DType dtype_{};
  Device device_{};
  std::string shapes_;
  double flops_ = 0, bytes_ = 0;
  int64_t start_ns_ = 0, alloc_before_ = 0, peak_before_ = 0;
  const char* transport_ = nullptr;
};

// The window of a collective, or of a wait for one, opened by the data-parallel code (distributed/,
// the trainer). No backend computes it: it is timed on the host clock, and the reports show
// `transport` ("mpi", "nccl": Communicator::transport, a string that outlives the profile) where an
// op shows its backend.
//
//   profiler::CommScope op("comm.all_reduce", comm.transport(device), {}, [&] { return OpCost{0, bytes}; });
class CommScope {
public:
  template <class CostFn>
  CommScope(const char* name, const char* transport, std::initializer_list<const Tensor*> inputs, CostFn&& cost)
      : op_(name, Backend::reference, inputs, std::forward<CostFn>(cost)) {
    op_.set_transport(transport);
  }

private:
  OpScope op_;
};

}  // namespace profiler
}  // namespace duet
