#include "backends/cuda/event_timeline.h"
#include <algorithm>
#include <cmath>
#include "engine/error.h"

namespace duet::cuda {

EventTimeline::Slot EventTimeline::take() {
  Slot s;
  if (free_.empty()) {
    s.index = static_cast<int>(slots_.size());
    s.fresh = true;
    slots_.emplace_back();
  } else {
    s.index = free_.back();
    free_.pop_back();
  }
  slots_[static_cast<size_t>(s.index)].in_use = true;
  last_ = s.index;
  return s;
}

void EventTimeline::give_back(int slot) {
  slots_[static_cast<size_t>(slot)] = SlotState{};
  free_.push_back(slot);
}

void EventTimeline::release_epoch_if_done(int64_t id) {
  const auto it = epochs_.find(id);
  if (it == epochs_.end() || id == open_ || it->second.markers > 0) return;
  give_back(it->second.ref_slot);
  epochs_.erase(it);
}

EventTimeline::Slot EventTimeline::open_epoch(int64_t host_ns) {
  close_epoch();
  const Slot s = take();
  const int64_t id = next_epoch_++;
  SlotState& st = slots_[static_cast<size_t>(s.index)];
  st.reference = true;
  st.epoch = id;
  epochs_[id] = Epoch{s.index, host_ns, 0};
  open_ = id;
  return s;
}

void EventTimeline::close_epoch() {
  const int64_t id = open_;
  open_ = -1;
  if (id >= 0) release_epoch_if_done(id);
}

int64_t EventTimeline::open_epoch_host_ns() const { return open_ >= 0 ? epochs_.at(open_).host_ns : 0; }

EventTimeline::Slot EventTimeline::add_marker() {
  DUET_CHECK(open_ >= 0, "profiler: a CUDA timing marker was recorded with no timeline open");
  const Slot s = take();
  SlotState& st = slots_[static_cast<size_t>(s.index)];
  st.epoch = open_;
  ++epochs_.at(open_).markers;
  ++pending_;
  return s;
}

bool EventTimeline::is_pending(int slot) const {
  return slot >= 0 && static_cast<size_t>(slot) < slots_.size() && slots_[static_cast<size_t>(slot)].in_use &&
         !slots_[static_cast<size_t>(slot)].reference;
}

int EventTimeline::reference_of(int slot) const {
  DUET_CHECK(is_pending(slot), "profiler: CUDA timing marker {} is not pending", slot);
  return epochs_.at(slots_[static_cast<size_t>(slot)].epoch).ref_slot;
}

int64_t EventTimeline::resolve(int slot, double elapsed_ms) {
  DUET_CHECK(is_pending(slot), "profiler: CUDA timing marker {} is not pending", slot);
  const int64_t id = slots_[static_cast<size_t>(slot)].epoch;
  Epoch& e = epochs_.at(id);
  // A marker cannot precede its reference on the stream; clamp rounding noise at zero.
  const int64_t ns = e.host_ns + std::llround(std::max(elapsed_ms, 0.0) * 1e6);
  --e.markers;
  --pending_;
  give_back(slot);
  release_epoch_if_done(id);
  return ns;
}

void EventTimeline::reset() {
  free_.clear();
  for (size_t i = slots_.size(); i-- > 0;) {
    slots_[i] = SlotState{};
    free_.push_back(static_cast<int>(i));
  }
  epochs_.clear();
  open_ = -1;
  pending_ = 0;
  last_ = -1;
}

}  // namespace duet::cuda
