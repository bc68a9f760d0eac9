// ImageFolder: one subfolder per class (classes sorted by name, as torchvision's ImageFolder),
// JPEG and PNG files decoded lazily by the loader's workers. Construction lists and checks every
// file, so a broken file is found before training starts, not hours into it.
#pragma once
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>
#include "datasets/image_dataset.h"
#include "datasets/image_file.h"

namespace duet::datasets {

// The .jpg, .jpeg and .png files under `dir`, recursively (following links, as torchvision does;
// hidden files and folders left out), sorted by path.
std::vector<std::string> list_image_files(const std::string& dir);

struct ImageFolderOptions {
  // Leave out files that fail the construction check (warning on stderr, listed by
  // skipped_files()) instead of throwing at the first one. A file that passes the check but whose
  // compressed data is corrupt still fails, naming the file, when a worker decodes it.
  bool skip_bad = false;
  // Check every file at construction (complete JPEG/PNG, readable header). Without it a bad file
  // surfaces as an error when a worker decodes it. skip_bad implies it.
  bool verify = true;
  int64_t image_size = 64;        // side of the square images the train/eval pipelines produce
  int64_t resize_short_side = 0;  // > 0: load() resizes so the shorter side is this many pixels
  // Keep loaded (decoded, resized) images in memory as u8 so later epochs don't decode again;
  // meant for small sets with resize_short_side (1,000 photos at 73 px: about 20 MB).
  bool cache = false;
  // Files declaring more pixels are refused (checked from the header before decoding).
  int64_t max_pixels = kDefaultMaxImagePixels;
};

class ImageFolder final : public ImageDataset {
public:
  explicit ImageFolder(const std::string& root, ImageFolderOptions opt = {});

  int64_t size() const override { return static_cast<int64_t>(paths_.size()); }
  Shape image_shape() const override { return {3, opt_.image_size, opt_.image_size}; }
  Sample load(int64_t index) const override;
  int64_t label(int64_t index) const override;
  std::vector<std::string> class_names() const override { return classes_; }
  Pipeline train_pipeline() const override { return imagenet_train_pipeline(opt_.image_size); }
  Pipeline eval_pipeline() const override { return imagenet_eval_pipeline(opt_.image_size); }

  const std::string& root() const { return root_; }
  const std::string& path(int64_t index) const;
  int64_t skipped() const { return static_cast<int64_t>(skipped_.size()); }
  const std::vector<std::string>& skipped_files() const { return skipped_; }
  int64_t cached() const { return cached_count_.load(); }

private:
  std::string root_;
  ImageFolderOptions opt_;
  std::vector<std::string> classes_;
  std::vector<std::string> paths_;
  std::vector<int64_t> labels_;
  std::vector<std::string> skipped_;  // "path: problem"
  mutable std::vector<Tensor> cache_;  // u8 [h, w, 3], allocated as data memory so it is counted
  mutable std::unique_ptr<std::atomic<bool>[]> ready_;  // cache_[i] is filled and won't change
  mutable std::mutex cache_mu_;
  mutable std::atomic<int64_t> cached_count_{0};
};

}  // namespace duet::datasets
