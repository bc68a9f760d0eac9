#include "backends/cuda/pinned_staging.h"

namespace duet::cuda {

namespace {
size_t block_size(size_t bytes, size_t limit) {
  size_t b = StagingBlocks::kMinBlock;
  while (b < bytes) b *= 2;
  return b < limit ? b : limit;  // bytes <= limit here, so the block still fits the copy
}
}  // namespace

StagingBlocks::Lease::~Lease() {
  if (!owner_) return;
  std::lock_guard<std::mutex> lk(owner_->mu_);
  owner_->blocks_[block_].state = State::free;
}

void* StagingBlocks::Lease::get() const {
  std::lock_guard<std::mutex> lk(owner_->mu_);
  return owner_->blocks_[block_].p;
}

void StagingBlocks::Lease::queued() {
  std::lock_guard<std::mutex> lk(owner_->mu_);
  Block& b = owner_->blocks_[block_];
  if (!b.event) b.event = owner_->rt_.new_event();
  owner_->rt_.record(b.event);
  b.state = State::in_flight;
  b.queued_at = ++owner_->clock_;
  owner_ = nullptr;
}

int64_t StagingBlocks::smallest_free(size_t bytes) const {
  int64_t best = -1;
  for (size_t i = 0; i < blocks_.size(); ++i) {
    const Block& b = blocks_[i];
    if (b.p && b.state == State::free && b.bytes >= bytes && (best < 0 || b.bytes < blocks_[size_t(best)].bytes))
      best = static_cast<int64_t>(i);
  }
  return best;
}

void StagingBlocks::refresh() {
  for (Block& b : blocks_)
    if (b.state == State::in_flight && rt_.finished(b.event)) b.state = State::free;
}

void StagingBlocks::give_back_free() {
  for (Block& b : blocks_)
    if (b.p && b.state == State::free) {
      rt_.release(b.p);
      held_ -= b.bytes;
      b.p = nullptr;
      b.bytes = 0;
    }
}

StagingBlocks::Lease StagingBlocks::acquire(size_t bytes) {
  if (bytes == 0 || bytes > limit_) return {};
  std::lock_guard<std::mutex> lk(mu_);
  refresh();
  const size_t want = block_size(bytes, limit_);
  for (;;) {
    if (const int64_t i = smallest_free(bytes); i >= 0) {
      blocks_[size_t(i)].state = State::leased;
      return Lease(this, size_t(i));
    }
    if (held_ + want > limit_) give_back_free();
    if (held_ + want <= limit_) {
      void* p = rt_.allocate(want);
      if (!p) return {};
      size_t slot = blocks_.size();
      for (size_t i = 0; i < blocks_.size(); ++i)
        if (!blocks_[i].p && blocks_[i].state == State::free) {
          slot = i;
          break;
        }
      if (slot == blocks_.size()) blocks_.emplace_back();
      Block& b = blocks_[slot];
      b.p = p;
      b.bytes = want;
      b.state = State::leased;
      held_ += want;
      return Lease(this, slot);
    }
    // Everything held is in flight (or leased): wait for the copy queued longest ago.
    Block* oldest = nullptr;
    for (Block& b : blocks_)
      if (b.state == State::in_flight && (!oldest || b.queued_at < oldest->queued_at)) oldest = &b;
    if (!oldest) return {};  // all leased by other threads' copies in progress: do not stage this one
    rt_.wait(oldest->event);
    oldest->state = State::free;
    ++waits_;
  }
}

size_t StagingBlocks::held_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return held_;
}

int64_t StagingBlocks::waits() const {
  std::lock_guard<std::mutex> lk(mu_);
  return waits_;
}

}  // namespace duet::cuda
