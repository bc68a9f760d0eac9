// A seeded image-classification task generated in memory, for tests and demos that must not
// depend on downloads. Class k is a sinusoidal grating with its own orientation and frequency,
// faintly tinted with its own colour; each image draws a random phase, an orientation and
// frequency jitter, a random contrast, a distracting grating of random orientation and heavy
// Gaussian noise. Telling classes apart needs oriented filters that a convnet learns in a few
// hundred steps; chance accuracy is 1/classes.
#pragma once
#include <vector>
#include "datasets/dataset.h"

namespace duet::datasets {

class SyntheticDataset final : public Dataset {
public:
  // Images first_index .. first_index + n - 1 of the task defined by (classes, channels, seed).
  // Two datasets with the same task and disjoint index ranges are a train/test split: they share
  // the class definitions but no images.
  SyntheticDataset(int64_t n, int64_t classes, int64_t channels, int64_t h, int64_t w, uint64_t seed,
                   int64_t first_index = 0);
  int64_t size() const override { return n_; }
  int64_t num_classes() const override { return classes_; }
  Shape image_shape() const override { return {c_, h_, w_}; }
  Batch batch(const std::vector<int64_t>& indices) const override;
  int64_t label(int64_t i) const;

private:
  int64_t n_, classes_, c_, h_, w_;
  std::vector<float> pixels_;  // n * c * h * w, normalised
  std::vector<int64_t> labels_;
};

}  // namespace duet::datasets
