// Stratified validation splits and index views of datasets (see split.h).
#include "datasets/split.h"
#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include "datasets/image_dataset.h"
#include "datasets/synthetic.h"
#include "engine/error.h"
#include "engine/rng.h"

namespace duet::datasets {

std::vector<int64_t> dataset_labels(const Dataset& ds) {
  std::vector<int64_t> labels(static_cast<size_t>(ds.size()));
  if (const auto* img = dynamic_cast<const ImageDataset*>(&ds)) {
    for (int64_t i = 0; i < ds.size(); ++i) labels[static_cast<size_t>(i)] = img->label(i);
  } else if (const auto* syn = dynamic_cast<const SyntheticDataset*>(&ds)) {
    for (int64_t i = 0; i < ds.size(); ++i) labels[static_cast<size_t>(i)] = syn->label(i);
  } else {
    const int64_t chunk = 256;
    for (int64_t start = 0; start < ds.size(); start += chunk) {
      std::vector<int64_t> idx;
      for (int64_t i = start; i < std::min(ds.size(), start + chunk); ++i) idx.push_back(i);
      const std::vector<int64_t> got = ds.batch(idx).labels.to_vector<int64_t>();
      std::copy(got.begin(), got.end(), labels.begin() + start);
    }
  }
  return labels;
}

SplitIndices stratified_split(const std::vector<int64_t>& labels, int64_t num_classes, double fraction, uint64_t seed,
                              const std::vector<std::string>& class_names) {
  DUET_CHECK(std::isfinite(fraction) && fraction > 0 && fraction < 1,
             "--val-fraction {}: expected a fraction of the training set strictly between 0 and 1 (0.1 holds out 10%)",
             fraction);
  DUET_CHECK(num_classes >= 1, "stratified_split: {} classes; expected at least one", num_classes);
  std::vector<std::vector<int64_t>> by_class(static_cast<size_t>(num_classes));
  for (size_t i = 0; i < labels.size(); ++i) {
    const int64_t c = labels[i];
    DUET_CHECK(c >= 0 && c < num_classes, "stratified_split: sample {} has label {}; expected 0..{}", i, c, num_classes - 1);
    by_class[static_cast<size_t>(c)].push_back(static_cast<int64_t>(i));
  }
  const auto name = [&](int64_t c) {
    return static_cast<size_t>(c) < class_names.size() ? fmt::format("'{}'", class_names[static_cast<size_t>(c)])
                                                       : fmt::format("{}", c);
  };
  SplitIndices out;
  for (int64_t c = 0; c < num_classes; ++c) {
    const std::vector<int64_t>& members = by_class[static_cast<size_t>(c)];
    const auto n = static_cast<int64_t>(members.size());
    const int64_t n_val = std::llround(fraction * static_cast<double>(n));
    DUET_CHECK(n > 0, "--val-fraction {}: class {} has no training samples to hold any out", fraction, name(c));
    DUET_CHECK(n_val >= 1,
               "--val-fraction {} leaves class {} ({} training samples) without a validation sample; expected a "
               "fraction of at least {:.3g} for it",
               fraction, name(c), n, 0.5 / static_cast<double>(n));
    DUET_CHECK(n_val < n,
               "--val-fraction {} leaves class {} ({} training samples) with nothing to train on; expected a fraction "
               "below {:.3g} for it",
               fraction, name(c), n, (static_cast<double>(n) - 0.5) / static_cast<double>(n));
    // Its own stream per class (and apart from the loader's epoch shuffles): a class's split does
    // not move when another class gains or loses samples.
    const uint64_t class_seed = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(c) + 0x76616c5f73706c74ull));
    const std::vector<int64_t> order = shuffled_indices(n, class_seed);
    for (int64_t k = 0; k < n; ++k) {
      const int64_t sample = members[static_cast<size_t>(order[static_cast<size_t>(k)])];
      (k < n_val ? out.val : out.train).push_back(sample);
    }
  }
  std::sort(out.train.begin(), out.train.end());
  std::sort(out.val.begin(), out.val.end());
  return out;
}

namespace {

void check_indices(const Dataset& base, const std::vector<int64_t>& indices) {
  for (int64_t i : indices)
    DUET_CHECK(i >= 0 && i < base.size(), "subset: index {} is outside the dataset's {} samples", i, base.size());
}

class ImageSubset final : public ImageDataset {
public:
  ImageSubset(std::shared_ptr<const ImageDataset> base, std::vector<int64_t> idx) : base_(std::move(base)), idx_(std::move(idx)) {}
  int64_t size() const override { return static_cast<int64_t>(idx_.size()); }
  Shape image_shape() const override { return base_->image_shape(); }
  Sample load(int64_t i) const override { return base_->load(at(i)); }
  int64_t label(int64_t i) const override { return base_->label(at(i)); }
  std::vector<std::string> class_names() const override { return base_->class_names(); }
  Pipeline train_pipeline() const override { return base_->train_pipeline(); }
  Pipeline eval_pipeline() const override { return base_->eval_pipeline(); }

private:
  int64_t at(int64_t i) const {
    DUET_CHECK(i >= 0 && i < size(), "subset: sample {} of {}", i, size());
    return idx_[static_cast<size_t>(i)];
  }
  std::shared_ptr<const ImageDataset> base_;
  std::vector<int64_t> idx_;
};

class TensorSubset final : public Dataset {
public:
  TensorSubset(std::shared_ptr<const Dataset> base, std::vector<int64_t> idx) : base_(std::move(base)), idx_(std::move(idx)) {}
  int64_t size() const override { return static_cast<int64_t>(idx_.size()); }
  int64_t num_classes() const override { return base_->num_classes(); }
  Shape image_shape() const override { return base_->image_shape(); }
  Batch batch(const std::vector<int64_t>& indices) const override {
    std::vector<int64_t> mapped;
    mapped.reserve(indices.size());
    for (int64_t i : indices) {
      DUET_CHECK(i >= 0 && i < size(), "subset: sample {} of {}", i, size());
      mapped.push_back(idx_[static_cast<size_t>(i)]);
    }
    return base_->batch(mapped);
  }

private:
  std::shared_ptr<const Dataset> base_;
  std::vector<int64_t> idx_;
};

}  // namespace

std::shared_ptr<Dataset> subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices) {
  DUET_CHECK(base != nullptr, "subset: no dataset given");
  check_indices(*base, indices);
  if (auto img = std::dynamic_pointer_cast<const ImageDataset>(base))
    return std::make_shared<ImageSubset>(std::move(img), std::move(indices));
  return std::make_shared<TensorSubset>(std::move(base), std::move(indices));
}

}  // namespace duet::datasets
