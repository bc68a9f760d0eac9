// The bookkeeping behind the profiler's per-op CUDA event timing, as plain host code (no CUDA types)
// so tests/test_cuda_host.cpp checks it without a GPU. event_timer.cpp owns the cudaEvent_t of each
// slot and does the recording; this class decides which slot each event goes into and what host
// time an elapsed time stands for.
//
// Events live in a pool of slots that is reused step after step, so steady-state profiling creates
// no events. Time is kept in epochs: an epoch starts with a reference event recorded while the
// device is idle, at a known host time (a step's beginning); every marker of the epoch is the
// reference's host time plus cudaEventElapsedTime(reference, marker). An epoch's reference slot is
// recycled once the epoch is closed and its last marker resolved.
#pragma once
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

namespace duet::cuda {

class EventTimeline {
public:
  // A pool slot to record into. `fresh`: the slot is new and its event must be created first.
  struct Slot {
    int index = -1;
    bool fresh = false;
  };

  // Closes the open epoch (if any) and opens one whose reference event goes into the returned
  // slot and is taken to fire at host_ns.
  Slot open_epoch(int64_t host_ns);
  // Later markers need a new open_epoch (the open one stays alive for its pending markers).
  void close_epoch();
  bool has_open_epoch() const { return open_ >= 0; }
  int64_t open_epoch_host_ns() const;  // the open epoch's reference time (0 when none)

  // A marker of the open epoch (duet::Error when none is open).
  Slot add_marker();
  size_t pending() const { return pending_; }  // markers recorded and not yet resolved
  bool is_pending(int slot) const;
  // The slot of the reference event a pending marker is measured from (duet::Error otherwise).
  int reference_of(int slot) const;
  // The slot recorded most recently (markers and references): waiting for its event waits for
  // every earlier one on the same stream. -1 when nothing was recorded since the last reset.
  int last_recorded() const { return last_; }
  // The marker's host time, given the milliseconds from its reference to it; recycles the slot
  // (and its epoch's reference once that epoch is closed and has no pending marker left).
  int64_t resolve(int slot, double elapsed_ms);

  // Forgets every marker and epoch: all slots return to the pool (their events are kept).
  void reset();
  size_t pool_size() const { return slots_.size(); }  // events created so far
  size_t free_slots() const { return free_.size(); }

private:
  struct SlotState {
    bool in_use = false;
    bool reference = false;
    int64_t epoch = -1;
  };
  struct Epoch {
    int ref_slot = -1;
    int64_t host_ns = 0;
    int64_t markers = 0;  // pending markers
  };
  Slot take();
  void give_back(int slot);
  void release_epoch_if_done(int64_t id);

  std::vector<SlotState> slots_;
  std::vector<int> free_;
  std::unordered_map<int64_t, Epoch> epochs_;
  int64_t open_ = -1;  // id of the open epoch
  int64_t next_epoch_ = 0;
  size_t pending_ = 0;
  int last_ = -1;
};

}  // namespace duet::cuda
