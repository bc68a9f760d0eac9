#include "engine/frozen_copies.h"
#include <memory>
#include <mutex>
#include <unordered_map>
#include <fmt/format.h>
#include "engine/allocator.h"

namespace duet {

namespace {
struct Entry {
  std::weak_ptr<Storage> source;
  uint64_t freeze = 0;
  Tensor copy;
};
struct Copies {
  std::mutex mu;
  std::unordered_map<std::string, Entry> map;
};
Copies& copies() {
  static Copies c;
  return c;
}
bool stale(const Entry& e) {
  const std::shared_ptr<Storage> s = e.source.lock();
  return !s || s->frozen.load() != e.freeze;
}
}  // namespace

Tensor frozen_copy(const Tensor& t, const std::string& what, const std::function<Tensor()>& make) {
  const uint64_t freeze = t.freeze_number();
  DUET_CHECK(freeze != 0, "frozen_copy({}): the tensor of shape {} is not frozen", what, shape_str(t.shape()));
  const std::string key = fmt::format("{}/{}/{}/{}", t.storage()->id, freeze, t.offset(), what);
  Copies& c = copies();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.map.find(key); it != c.map.end()) return it->second.copy;
  }
  Tensor copy;
  {
    MemTagGuard tag(MemTag::parameter);
    copy = make();
  }
  std::lock_guard<std::mutex> lock(c.mu);
  for (auto it = c.map.begin(); it != c.map.end();) it = stale(it->second) ? c.map.erase(it) : std::next(it);
  return c.map.emplace(key, Entry{t.storage(), freeze, copy}).first->second.copy;
}

size_t frozen_copies_kept() {
  Copies& c = copies();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.map.size();
}

}  // namespace duet
