#include "engine/frozen_copies.h"
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <fmt/format.h>
#include "engine/allocator.h"

namespace duet {

namespace {
// What a copy is of: the source storage under one freeze, at an offset, and what was made of it.
// Looked up without copying `what` (KeyView: C++20's heterogeneous lookup), since a frozen model's
// inference looks up a few copies per layer per forward.
struct KeyView {
  uint64_t storage = 0, freeze = 0;
  int64_t offset = 0;
  std::string_view what;
};
struct Key {
  uint64_t storage = 0, freeze = 0;
  int64_t offset = 0;
  std::string what;
  KeyView view() const { return {storage, freeze, offset, what}; }
};
struct KeyHash {
  using is_transparent = void;
  size_t operator()(const KeyView& k) const {
    size_t h = std::hash<std::string_view>{}(k.what);
    for (const uint64_t v : {k.storage, k.freeze, static_cast<uint64_t>(k.offset)}) h = h * 1000003u ^ std::hash<uint64_t>{}(v);
    return h;
  }
  size_t operator()(const Key& k) const { return (*this)(k.view()); }
};
struct KeyEqual {
  using is_transparent = void;
  static bool same(const KeyView& a, const KeyView& b) {
    return a.storage == b.storage && a.freeze == b.freeze && a.offset == b.offset && a.what == b.what;
  }
  bool operator()(const Key& a, const Key& b) const { return same(a.view(), b.view()); }
  bool operator()(const KeyView& a, const Key& b) const { return same(a, b.view()); }
  bool operator()(const Key& a, const KeyView& b) const { return same(a.view(), b); }
};
struct Entry {
  std::weak_ptr<Storage> source;
  uint64_t freeze = 0;
  Tensor copy;
};
struct Copies {
  std::mutex mu;
  std::unordered_map<Key, Entry, KeyHash, KeyEqual> map;
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

namespace detail {
Tensor frozen_copy(const Tensor& t, std::string_view what, Tensor (*make)(void*), void* make_state) {
  const uint64_t freeze = t.freeze_number();
  DUET_CHECK(freeze != 0, "frozen_copy({}): the tensor of shape {} is not frozen", what, shape_str(t.shape()));
  const KeyView key{t.storage()->id, freeze, t.offset(), what};
  Copies& c = copies();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (auto it = c.map.find(key); it != c.map.end()) return it->second.copy;
  }
  Tensor copy;
  {
    MemTagGuard tag(MemTag::parameter);
    copy = make(make_state);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  // A copy made from a kept copy (a frozen weight's OHWI matrix, then its packed panels) goes stale
  // when the copy it was made from is dropped, which may come later in the same pass: pass again
  // until a pass drops nothing, so that a count taken after this add holds no stale copy.
  for (bool dropped = true; dropped;) {
    dropped = false;
    for (auto it = c.map.begin(); it != c.map.end();) {
      if (stale(it->second)) {
        it = c.map.erase(it);
        dropped = true;
      } else {
        ++it;
      }
    }
  }
  return c.map.emplace(Key{key.storage, key.freeze, key.offset, std::string(what)}, Entry{t.storage(), freeze, copy})
      .first->second.copy;
}
}  // namespace detail

size_t frozen_copies_kept() {
  Copies& c = copies();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.map.size();
}

}  // namespace duet
