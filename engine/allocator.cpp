#include "engine/allocator.h"
#include <cstdlib>
#include <new>
#include "engine/error.h"

namespace duet {

const char* mem_tag_name(MemTag t) {
  switch (t) {
    case MemTag::activation: return "activation";
    case MemTag::parameter: return "parameter";
    case MemTag::gradient: return "gradient";
    case MemTag::optimizer_state: return "optimizer_state";
    case MemTag::workspace: return "workspace";
    case MemTag::data: return "data";
    case MemTag::count: break;
  }
  return "?";
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return s_;
}

Allocator::Usage Allocator::usage() const {
  std::lock_guard<std::mutex> lk(mu_);
  return {s_.current, s_.peak};
}

namespace {
thread_local int64_t t_allocated = 0;
}
int64_t thread_allocated_bytes() { return t_allocated; }

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lk(mu_);
  s_.peak = s_.current;
  s_.peak_by_tag = s_.by_tag;
}

void Allocator::count_alloc(size_t bytes, MemTag tag) {
  t_allocated += static_cast<int64_t>(bytes);
  std::lock_guard<std::mutex> lk(mu_);
  const int i = static_cast<int>(tag);
  s_.current += static_cast<int64_t>(bytes);
  s_.allocations++;
  s_.allocated_total += static_cast<int64_t>(bytes);
  s_.by_tag[i] += static_cast<int64_t>(bytes);
  if (s_.current > s_.peak) s_.peak = s_.current;
  if (s_.by_tag[i] > s_.peak_by_tag[i]) s_.peak_by_tag[i] = s_.by_tag[i];
}

void Allocator::count_free(size_t bytes, MemTag tag) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.current -= static_cast<int64_t>(bytes);
  s_.frees++;
  s_.by_tag[static_cast<int>(tag)] -= static_cast<int64_t>(bytes);
}

void Allocator::set_cached(int64_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  s_.cached = bytes;
}

void Allocator::retag(size_t bytes, MemTag from, MemTag to) {
  std::lock_guard<std::mutex> lk(mu_);
  const int f = static_cast<int>(from), t = static_cast<int>(to);
  s_.by_tag[f] -= static_cast<int64_t>(bytes);
  s_.by_tag[t] += static_cast<int64_t>(bytes);
  if (s_.by_tag[t] > s_.peak_by_tag[t]) s_.peak_by_tag[t] = s_.by_tag[t];
}

void* CpuAllocator::allocate(size_t bytes, MemTag tag) {
  // aligned_alloc needs a size that is a multiple of the alignment; zero-byte tensors still get
  // a unique pointer so that storage identity works.
  const size_t rounded = ((bytes + kAlignment - 1) / kAlignment) * kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded);
  if (!p) throw Error(fmt::format("out of host memory: could not allocate {} bytes for a {} buffer", bytes, mem_tag_name(tag)));
  count_alloc(bytes, tag);
  return p;
}

void CpuAllocator::deallocate(void* p, size_t bytes, MemTag tag) {
  std::free(p);
  count_free(bytes, tag);
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

namespace {
thread_local MemTag t_tag = MemTag::activation;
}
MemTag current_mem_tag() { return t_tag; }
MemTagGuard::MemTagGuard(MemTag t) : prev_(t_tag) { t_tag = t; }
MemTagGuard::~MemTagGuard() { t_tag = prev_; }

}  // namespace duet
