// cudaEvent recording and resolution for the profiler's per-op timing (see event_timer.h).
#include "backends/cuda/event_timer.h"
#include <map>
#include <memory>
#include <mutex>
#include <vector>
#include "backends/cuda/cuda_check.h"
#include "backends/cuda/device.h"
#include "backends/cuda/event_timeline.h"
#include "engine/profiler/events.h"

namespace duet::cuda {

namespace {

constexpr const char* kOp = "profiler event timing";
// An epoch older than this is replaced at the next marker: cudaEventElapsedTime returns a float of
// milliseconds, whose resolution (about 1 us at 10 s) would otherwise degrade in a long run of ops
// outside any step (an evaluation pass).
constexpr int64_t kMaxEpochNs = 10'000'000'000;

class CudaEventTimer final : public profiler::DeviceTimer {
public:
  void begin_timeline(Device d) override {
    std::lock_guard<std::mutex> lk(mu_);
    open_epoch(device_index(d));
  }

  int64_t mark(Device d) noexcept override {
    try {
      if (device_count() == 0) return -1;
      std::lock_guard<std::mutex> lk(mu_);
      const int i = device_index(d);
      PerDevice& p = per_device(i);
      if (!p.timeline.has_open_epoch() || profiler::now_ns() - p.timeline.open_epoch_host_ns() > kMaxEpochNs)
        open_epoch(i);
      const EventTimeline::Slot s = p.timeline.add_marker();
      record(i, p, s);
      return (static_cast<int64_t>(i) << 32) | s.index;
    } catch (...) {
      return -1;  // the op is then timed on the host clock; the error will surface at its kernel call
    }
  }

  std::vector<int64_t> resolve(const std::vector<int64_t>& ids) override {
    std::lock_guard<std::mutex> lk(mu_);
    // One wait per device: for the most recent event of its stream, which the stream reaches
    // after every earlier marker. After step_end's synchronisation this returns at once.
    std::map<int, bool> waited;
    for (int64_t id : ids) {
      const int i = static_cast<int>(id >> 32);
      if (waited[i]) continue;
      waited[i] = true;
      PerDevice& p = per_device(i);
      DUET_CUDA_CHECK(cudaSetDevice(i), kOp);
      if (p.timeline.last_recorded() >= 0)
        DUET_CUDA_CHECK(cudaEventSynchronize(p.events[static_cast<size_t>(p.timeline.last_recorded())]), kOp);
    }
    std::vector<int64_t> ns;
    ns.reserve(ids.size());
    for (int64_t id : ids) {
      PerDevice& p = per_device(static_cast<int>(id >> 32));
      const int slot = static_cast<int>(id & 0xffffffff);
      if (!p.timeline.is_pending(slot)) {  // discarded by profiler::clear() while its op ran
        ns.push_back(-1);
        continue;
      }
      float ms = 0;
      DUET_CUDA_CHECK(cudaEventElapsedTime(&ms, p.events[static_cast<size_t>(p.timeline.reference_of(slot))],
                                           p.events[static_cast<size_t>(slot)]),
                      kOp);
      ns.push_back(p.timeline.resolve(slot, ms));
    }
    return ns;
  }

  size_t pending() const override {
    std::lock_guard<std::mutex> lk(mu_);
    size_t n = 0;
    for (const auto& p : devices_)
      if (p) n += p->timeline.pending();
    return n;
  }

  void discard() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& p : devices_)
      if (p) p->timeline.reset();
  }

private:
  struct PerDevice {
    EventTimeline timeline;
    std::vector<cudaEvent_t> events;  // one per pool slot
  };

  // The device a marker goes to: d itself, or for a host-side d (the source of a host-to-device
  // copy) the calling thread's current device, which the op's device guard has selected.
  static int device_index(Device d) {
    if (d.type == DeviceType::cuda) return d.index;
    int i = 0;
    DUET_CUDA_CHECK(cudaGetDevice(&i), kOp);
    return i;
  }

  PerDevice& per_device(int i) {
    if (static_cast<size_t>(i) >= devices_.size()) devices_.resize(static_cast<size_t>(i) + 1);
    if (!devices_[static_cast<size_t>(i)]) devices_[static_cast<size_t>(i)] = std::make_unique<PerDevice>();
    return *devices_[static_cast<size_t>(i)];
  }

  void record(int i, PerDevice& p, const EventTimeline::Slot& s) {
    DeviceContext& ctx = context(i, kOp);
    const auto k = static_cast<size_t>(s.index);
    if (p.events.size() <= k) p.events.resize(k + 1, nullptr);
    // A fresh slot gets its event; default flags keep timing enabled.
    if (!p.events[k]) DUET_CUDA_CHECK(cudaEventCreate(&p.events[k]), kOp);
    DUET_CUDA_CHECK(cudaEventRecord(p.events[k], ctx.stream()), kOp);
  }

  // A new reference: recorded while the stream is idle (a step starts after the previous one's
  // synchronisation, so normally no wait happens here), so it fires at the host time read now.
  void open_epoch(int i) {
    DeviceContext& ctx = context(i, kOp);
    if (stream_busy(ctx.stream(), kOp)) ctx.synchronize(kOp);
    PerDevice& p = per_device(i);
    const EventTimeline::Slot s = p.timeline.open_epoch(profiler::now_ns());
    record(i, p, s);
  }

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<PerDevice>> devices_;
};

}  // namespace

profiler::DeviceTimer& event_timer() {
  static CudaEventTimer* t = new CudaEventTimer;  // never destroyed, see event_timer.h
  return *t;
}

}  // namespace duet::cuda
