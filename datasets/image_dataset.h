// ImageDataset: a Dataset of u8 images that are decoded on demand, one sample at a time, so the
// DataLoader's workers can decode and augment off the training thread; and make_batch, which
// runs a transform Pipeline over samples into one batch tensor.
#pragma once
#include <atomic>
#include <string>
#include <vector>
#include "datasets/dataset.h"
#include "datasets/transforms.h"

namespace duet::datasets {

struct Sample {
  Image image;  // u8 HWC
  int64_t label = 0;
};

class ImageDataset : public Dataset {
public:
  // Thread-safe; throws duet::Error naming the file and the problem when a sample can't be read.
  virtual Sample load(int64_t index) const = 0;
  virtual int64_t label(int64_t index) const = 0;  // without decoding
  virtual std::vector<std::string> class_names() const = 0;
  // The dataset's standard augmentation, and the deterministic pipeline batch() uses.
  virtual Pipeline train_pipeline() const = 0;
  virtual Pipeline eval_pipeline() const = 0;

  int64_t num_classes() const override { return static_cast<int64_t>(class_names().size()); }
  Batch batch(const std::vector<int64_t>& indices) const override;  // eval_pipeline, NCHW
};

// load() + pipeline for each index into f32 [B, C, H, W] (channels-last memory when asked) and
// i64 labels, allocated as data memory. Each sample's randomness comes from (seed, epoch, index).
// Returns an empty Batch when `cancel` becomes true part-way (the loader is shutting down).
Batch make_batch(const ImageDataset& ds, const std::vector<int64_t>& indices, const Pipeline& pipeline, uint64_t seed,
                 int64_t epoch, bool channels_last, const std::atomic<bool>* cancel = nullptr);

}  // namespace duet::datasets
