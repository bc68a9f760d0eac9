// Broadcast of weights and the configuration check (see sync.h).
#include "distributed/sync.h"
#include <cstring>
#include <fmt/format.h>
#include "engine/error.h"
#include "engine/hash.h"

namespace duet::dist {

namespace {
uint64_t hash_of(const std::pair<std::string, std::string>& kv) { return fnv1a(kv.second, fnv1a(kv.first + '\0')); }

// Every rank's copy of `value`, in rank order (one broadcast per rank: only for short strings).
std::vector<std::string> gather_strings(Communicator& comm, const std::string& value) {
  std::vector<std::string> all;
  for (int r = 0; r < comm.size(); ++r) {
    uint64_t n = r == comm.rank() ? value.size() : 0;
    comm.broadcast(&n, sizeof n, r);
    std::string s = r == comm.rank() ? value : std::string(n, '\0');
    comm.broadcast(s.data(), s.size(), r);
    all.push_back(std::move(s));
  }
  return all;
}
}  // namespace

void broadcast_tensors(Communicator& comm, const std::vector<Tensor>& tensors, int root) {
  if (comm.size() == 1) return;
  for (const Tensor& t : tensors) {
    if (!t.defined() || t.numel() == 0) continue;
    if (t.device().type == DeviceType::cpu && t.is_dense()) {
      comm.broadcast(t.raw_data(), t.nbytes(), root);  // the storage span, whatever the layout
      continue;
    }
    Tensor h = t.to(Device::cpu()).contiguous();
    comm.broadcast(h.raw_data(), h.nbytes(), root);
    t.copy_(h);
  }
}

void check_same_on_all_ranks(Communicator& comm, const Settings& settings) {
  if (comm.size() == 1) return;
  uint64_t all = fnv1a(std::to_string(settings.size()));
  for (const auto& kv : settings) all = fnv1a(std::to_string(hash_of(kv)), all);
  const std::vector<uint64_t> hashes = comm.all_gather(all);
  bool same = true;
  for (uint64_t h : hashes) same = same && h == hashes[0];
  if (same) return;
  const std::vector<uint64_t> counts = comm.all_gather(settings.size());
  for (size_t r = 0; r < counts.size(); ++r)
    DUET_CHECK(counts[r] == counts[0], "the ranks were configured differently ({} settings on rank {}, {} on rank 0): "
               "every rank must run the same duet with the same options", counts[r], r, counts[0]);
  for (const auto& kv : settings) {
    const std::vector<uint64_t> h = comm.all_gather(hash_of(kv));
    bool equal = true;
    for (uint64_t v : h) equal = equal && v == h[0];
    if (equal) continue;
    const std::vector<std::string> names = gather_strings(comm, kv.first);
    const std::vector<std::string> values = gather_strings(comm, kv.second);
    std::string by_rank;
    for (size_t r = 0; r < values.size(); ++r)
      by_rank += fmt::format("{}rank {}: {}{}", r ? ", " : "", r, names[r] == kv.first ? "" : names[r] + " = ", values[r]);
    throw Error(fmt::format("the ranks were started with different options: {} differs ({}); every rank of a "
                            "data-parallel run must get the same options",
                            kv.first, by_rank));
  }
  throw Error("the ranks' configurations differ, but no single setting does (internal)");
}

}  // namespace duet::dist
