// A validation split held out of a training set: stratified by class (each class gives the same
// fraction of its samples), drawn from a seed, and the two parts as datasets of their own (views
// of the original by index, so nothing is copied or decoded twice).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "datasets/dataset.h"

namespace duet::datasets {

struct SplitIndices {
  std::vector<int64_t> train, val;  // indices into the original dataset, each list ascending
};

// Every sample's label: read without decoding where the dataset can (image and synthetic
// datasets), else through batch().
std::vector<int64_t> dataset_labels(const Dataset& ds);

// For each class c with n_c samples, round(fraction * n_c) of them, chosen by a shuffle that depends
// only on (seed, c), go to validation and the rest stay for training. duet::Error when fraction is
// not in (0, 1) or when a class would be left with no validation sample or no training sample
// (the message names the class, its count and the fraction that would do). class_names, when
// given, name the classes in messages.
SplitIndices stratified_split(const std::vector<int64_t>& labels, int64_t num_classes, double fraction, uint64_t seed,
                              const std::vector<std::string>& class_names = {});

// The samples `indices` of `base`, in that order, as a dataset. An ImageDataset's subset is an
// ImageDataset (same classes, pipelines and per-sample loading), so loaders treat it the same.
std::shared_ptr<Dataset> subset(std::shared_ptr<const Dataset> base, std::vector<int64_t> indices);

}  // namespace duet::datasets
