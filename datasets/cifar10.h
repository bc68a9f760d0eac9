// CIFAR-10 in the official binary format: records of 1 label byte and 3072 pixel bytes (1024 red,
// 1024 green, 1024 blue, each a row-major 32x32 plane), no header. Images stay u8 in memory
// (30 MB per 10,000) and are converted per batch.
#pragma once
#include <string>
#include <vector>
#include "datasets/image_dataset.h"

namespace duet::datasets {

class Cifar10 final : public ImageDataset {
public:
  static constexpr int64_t kSide = 32;
  static constexpr int64_t kRecordBytes = 1 + 3 * kSide * kSide;  // 3073

  // The records of every file, in order (pass a std::vector: a two-element brace list would also
  // match the (dir, split) constructor). Class names come from batches.meta.txt next to the first
  // file when it is there (else the standard ten).
  explicit Cifar10(const std::vector<std::string>& files);
  // split "train": data_batch_1.bin .. data_batch_5.bin, those present in `dir` (at least one);
  // "test": test_batch.bin.
  Cifar10(const std::string& dir, const std::string& split);
  static std::vector<std::string> split_files(const std::string& dir, const std::string& split);

  int64_t size() const override { return n_; }
  Shape image_shape() const override { return {3, kSide, kSide}; }
  Sample load(int64_t index) const override;
  int64_t label(int64_t index) const override;
  std::vector<std::string> class_names() const override { return names_; }
  Pipeline train_pipeline() const override { return cifar10_train_pipeline(); }
  Pipeline eval_pipeline() const override { return cifar10_eval_pipeline(); }
  const std::vector<std::string>& files() const { return files_; }

private:
  std::vector<std::string> files_;
  std::vector<std::string> names_;
  int64_t n_ = 0;
  Tensor pixels_;  // u8 [n, 32, 32, 3]: stored HWC so load() is one copy
  std::vector<uint8_t> labels_;
};

// The ten class names of batches.meta.txt (one a line, blank lines ignored); throws when the file
// is there but does not hold ten names.
std::vector<std::string> read_cifar10_meta(const std::string& path);

}  // namespace duet::datasets
