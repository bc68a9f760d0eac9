// What every dataset hands the training loop: a batch of images and their class labels, and the
// shuffled order of an epoch. Image datasets (synthetic, CIFAR-10, image folders) derive from
// Dataset so one training loop serves them all.
#pragma once
#include <cstdint>
#include <vector>
#include "engine/tensor.h"

namespace duet::datasets {

struct Batch {
  Tensor images;  // f32 [B, C, H, W], normalised
  Tensor labels;  // i64 [B], class indices
};

class Dataset {
public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  virtual int64_t num_classes() const = 0;
  virtual Shape image_shape() const = 0;  // [C, H, W]
  // The samples at `indices`, in that order, on the host; allocated as data memory.
  virtual Batch batch(const std::vector<int64_t>& indices) const = 0;
};

// 0..n-1 in a random order that depends only on seed (Fisher-Yates on a counter-based stream).
std::vector<int64_t> shuffled_indices(int64_t n, uint64_t seed);

// The indices of each batch of an epoch over `order`; the last batch may be short unless
// drop_last, in which case it is left out.
std::vector<std::vector<int64_t>> batches_of(const std::vector<int64_t>& order, int64_t batch_size,
                                             bool drop_last = false);

}  // namespace duet::datasets
