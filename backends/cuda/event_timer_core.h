// The profiler's per-op CUDA event timing (event_timer.h) as host logic over a device-side `Events`
// type, so that tests/test_cuda_host.cpp runs it against a fake device: when a marker opens a new
// epoch, how the reference is recorded, how markers are resolved. event_timer.cpp instantiates it
// with the CUDA runtime's events. `Events` provides:
//
//   int device_count();  int current_device();  int64_t now_ns();
//   bool stream_busy(int dev);
//   void wait_for_stream(int dev);   // waits for the stream; leaves a loss's label record in place
//   void record(int dev, int slot);  // records the slot's event on the stream (created when new)
//   void wait_event(int dev, int slot);
//   double elapsed_ms(int dev, int from_slot, int to_slot);
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <vector>
#include "backends/cuda/event_timeline.h"
#include "engine/profiler/device_timer.h"

namespace duet::cuda {

// An epoch older than this is replaced at the next marker: cudaEventElapsedTime returns a float of
// milliseconds, whose resolution (about 1 us at 10 s) would otherwise degrade in a long run of ops
// outside any step (an evaluation pass).
constexpr int64_t kMaxEpochNs = 10'000'000'000;

template <class Events>
class EventTimerCore final : public profiler::DeviceTimer {
public:
  explicit EventTimerCore(Events events = {}) : ev_(std::move(events)) {}
  Events& events() { return ev_; }

  void begin_timeline(Device d) override {
    std::lock_guard<std::mutex> lk(mu_);
    open_epoch(index_of(d));
  }

  int64_t mark(Device d) noexcept override {
    try {
      if (ev_.device_count() == 0) return -1;
      std::lock_guard<std::mutex> lk(mu_);
      const int i = index_of(d);
      EventTimeline& tl = timeline(i);
      if (!tl.has_open_epoch() || ev_.now_ns() - tl.open_epoch_host_ns() > kMaxEpochNs) open_epoch(i);
      const EventTimeline::Slot s = tl.add_marker();
      ev_.record(i, s.index);
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
      if (timeline(i).last_recorded() >= 0) ev_.wait_event(i, timeline(i).last_recorded());
    }
    std::vector<int64_t> ns;
    ns.reserve(ids.size());
    for (int64_t id : ids) {
      const int i = static_cast<int>(id >> 32);
      EventTimeline& tl = timeline(i);
      const int slot = static_cast<int>(id & 0xffffffff);
      if (!tl.is_pending(slot)) {  // discarded by profiler::clear() while its op ran
        ns.push_back(-1);
        continue;
      }
      ns.push_back(tl.resolve(slot, ev_.elapsed_ms(i, tl.reference_of(slot), slot)));
    }
    return ns;
  }

  size_t pending() const override {
    std::lock_guard<std::mutex> lk(mu_);
    size_t n = 0;
    for (const auto& tl : timelines_)
      if (tl) n += tl->pending();
    return n;
  }

  void discard() override {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& tl : timelines_)
      if (tl) tl->reset();
  }

private:
  // The device a marker goes to: d itself, or for a host-side d (the source of a host-to-device
  // copy) the calling thread's current device, which the op's device guard has selected.
  int index_of(Device d) { return d.type == DeviceType::cuda ? d.index : ev_.current_device(); }

  EventTimeline& timeline(int i) {
    if (static_cast<size_t>(i) >= timelines_.size()) timelines_.resize(static_cast<size_t>(i) + 1);
    if (!timelines_[static_cast<size_t>(i)]) timelines_[static_cast<size_t>(i)] = std::make_unique<EventTimeline>();
    return *timelines_[static_cast<size_t>(i)];
  }

  // A new reference, recorded while the stream is idle (a step starts after the previous one's
  // synchronisation, so normally nothing waits here), so that it fires at the host time read now.
  // The wait leaves a loss's invalid-label record alone: mark() is noexcept and would swallow the
  // error, which the next synchronisation (.item(), a copy to the host) is there to report.
  void open_epoch(int i) {
    if (ev_.stream_busy(i)) ev_.wait_for_stream(i);
    const EventTimeline::Slot s = timeline(i).open_epoch(ev_.now_ns());
    ev_.record(i, s.index);
  }

  mutable std::mutex mu_;
  Events ev_;
  std::vector<std::unique_ptr<EventTimeline>> timelines_;
};

}  // namespace duet::cuda
