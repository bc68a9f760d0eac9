#include "datasets/dataset.h"
#include <numeric>
#include "engine/rng.h"

namespace duet::datasets {

std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed) {
  DUET_CHECK(n >= 0, "shuffled_indices: n must be >= 0, got {}", n);
  std::vector<int64_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(uniform01(seed, static_cast<uint64_t>(i)) * static_cast<double>(i + 1));
    std::swap(v[static_cast<size_t>(i)], v[static_cast<size_t>(std::min(j, i))]);
  }
  return v;
}

std::vector<std::vector<int64_t>> batches_of(const std::vector<int64_t>& order, int64_t batch_size, bool drop_last) {
  DUET_CHECK(batch_size >= 1, "batches_of: batch size must be >= 1, got {}", batch_size);
  std::vector<std::vector<int64_t>> out;
  const auto n = static_cast<int64_t>(order.size());
  for (int64_t start = 0; start < n; start += batch_size) {
    const int64_t end = std::min(n, start + batch_size);
    if (drop_last && end - start < batch_size) break;
    out.emplace_back(order.begin() + start, order.begin() + end);
  }
  return out;
}

}  // namespace duet::datasets
