// The datasets a run trains and evaluates on, built from the command line's data options:
// synthetic (no files), cifar10 (the official binary batches) or folder (train/ and test/ of
// class folders), with the augmentation the flags ask for and the eval transform recorded so
// `duet eval` and `duet predict` can rebuild it from a checkpoint.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "train/json_optional.h"
#include "datasets/dataset.h"
#include "datasets/transforms.h"

namespace duet::app {

// The data options of a run (--dataset, --data, augmentation, loader; cli/run_options.h).
struct DataOptions {
  std::string dataset = "synthetic";  // synthetic | cifar10 | folder
  std::string path;                   // cifar10: the folder with data_batch_*.bin; folder: with train/ and test/
  int64_t image_size = 0;             // 0: the dataset's (32 synthetic and cifar10, 64 folder)
  int64_t train_size = 2048, test_size = 512, synthetic_classes = 10;  // synthetic only
  // Augmentation; unset fields keep the dataset's standard recipe (cifar10: crop 32 padding 4 +
  // flip; folder: random-resized crop + flip; synthetic: none).
  std::optional<int64_t> crop_padding;  // random crop of image_size after zero padding
  std::optional<bool> flip;
  std::optional<double> scale_min;  // folder: random-resized crop with area fraction in [scale_min, 1]
  bool no_augment = false;
  int workers = 2;
  std::string memory_format = "auto";  // auto | nhwc | nchw
  bool skip_bad = false;               // folder: leave out broken files instead of stopping
  int64_t max_image_pixels = 8192LL * 8192;  // folder: larger images are refused before decoding
  double val_fraction = 0;  // > 0: this fraction of the training set held out for validation (train/val_split.h)
};

// What the trainer and evaluator need of the data.
struct TrainData {
  std::shared_ptr<datasets::Dataset> train, test;
  std::shared_ptr<datasets::Dataset> val;  // --val-fraction: held out of the training set; else null
  std::optional<datasets::Pipeline> train_pipeline, eval_pipeline;  // image datasets only
  std::vector<std::string> class_names;
  int64_t image_size = 0;
  std::string summary;  // one line for the run's header
  // The eval transform of an image file ("resize_shorter", "center_crop", "mean", "std"), or null
  // for synthetic data (no image files to predict on).
  nlohmann::json eval_transform;
};

// Throws duet::Error naming the missing path or the bad option.
TrainData make_train_data(const DataOptions& o, uint64_t seed);
// Only the test split (duet eval): split "test", "train" (unaugmented) or "val" (a run with
// --val-fraction: its validation split, and then "train" is the rest).
TrainData make_eval_data(const DataOptions& o, uint64_t seed, const std::string& split);

// The pipeline an image file goes through for prediction, from eval_transform.
datasets::Pipeline pipeline_from_json(const nlohmann::json& eval_transform);
// Stored in checkpoints under these names (unset augmentation fields as null); a missing key
// reads as the default. max_image_pixels is a safety limit of the machine, not of the run: not
// stored.
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE_WITH_DEFAULT(DataOptions, dataset, path, image_size, train_size, test_size,
                                                synthetic_classes, crop_padding, flip, scale_min, no_augment, workers,
                                                memory_format, skip_bad, val_fraction)

}  // namespace duet::app
