// The model and data option groups (see run_options.h).
#include "cli/run_options.h"
#include <string>
#include <CLI/CLI.hpp>
#include "cli/option_checks.h"

namespace duet::app {

void add_model_options(CLI::App& cmd, ModelConfig& m) {
  const std::string g = "Model";
  cmd.add_option("--model", m.name, "Model name (list them with `duet models`)")->capture_default_str()->group(g);
  cmd.add_option("--classes", m.classes, "Output classes (default: the dataset's; with --dataset synthetic, how many classes to generate, default 10)")->check(CLI::Range(int64_t{0}, int64_t{1000000}))->group(g);
  cmd.add_option("--width-mult", m.width_mult, "Channel multiplier (0.5: half-width ResNet, ...)")
      ->capture_default_str()
      ->check(finite_range(0.01, 16.0))
      ->group(g);
  cmd.add_option("--dropout", m.dropout, "Dropout probability where the model has dropout (default: the model's)")
      ->check(finite_range(0.0, 0.99))
      ->group(g);
}

void add_data_options(CLI::App& cmd, DataOptions& o) {
  const std::string g = "Data";
  cmd.add_option("--dataset", o.dataset,
                 "synthetic (generated, no files), cifar10 (--data: folder with data_batch_*.bin and test_batch.bin) or "
                 "folder (--data: folder with train/ and test/, one subfolder per class)")
      ->check(CLI::IsMember({"synthetic", "cifar10", "folder"}))
      ->capture_default_str()
      ->group(g);
  cmd.add_option("--data", o.path, "Dataset folder (cifar10, folder)")->group(g);
  cmd.add_option("--image-size", o.image_size, "Image side the model sees (default: 32 synthetic/cifar10, 64 folder)")
      ->check(CLI::Range(int64_t{4}, int64_t{1024}))
      ->group(g);
  cmd.add_option("--train-size", o.train_size, "Synthetic training images")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{100000000}))->group(g);
  cmd.add_option("--test-size", o.test_size, "Synthetic test images")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{100000000}))->group(g);
  cmd.add_option("--crop-padding", o.crop_padding,
                 "Augment: random crop of the image size after zero padding by N pixels (cifar10 default 4; folder: a "
                 "random window of the image resized to 8/7 of the size)")
      ->check(CLI::Range(int64_t{0}, int64_t{1024}))
      ->group(g);
  // Two flags (CLI11 2.1 cannot bind a negatable flag to std::optional<bool>).
  cmd.add_flag_function("--flip", [&o](int64_t) { o.flip = true; }, "Augment: random horizontal flips (the default for "
                                                                     "cifar10 and folder)")
      ->group(g);
  cmd.add_flag_function("--no-flip", [&o](int64_t) { o.flip = false; }, "Augment: no horizontal flips")->group(g);
  cmd.add_option("--scale-min", o.scale_min,
                 "Augment (folder): random-resized crop keeping [S, 1] of the area (default 0.08, torchvision's)")
      ->check(finite_range(0.01, 1.0))
      ->group(g);
  cmd.add_flag("--no-augment", o.no_augment, "No augmentation: train on the eval transform")->group(g);
  cmd.add_option("--workers", o.workers, "Loader threads decoding and augmenting ahead of training (0: on the training "
                                         "thread)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64))
      ->group(g);
  cmd.add_option("--memory-format", o.memory_format,
                 "Input batch layout: nhwc (channels-last, oneDNN's fast path), nchw, or auto (nhwc on the cpu backend)")
      ->check(CLI::IsMember({"auto", "nhwc", "nchw", "channels_last", "contiguous"}))
      ->capture_default_str()
      ->group(g);
  cmd.add_flag("--skip-bad", o.skip_bad, "folder: leave out unreadable image files (with a warning) instead of stopping")
      ->group(g);
  cmd.add_option("--max-image-pixels", o.max_image_pixels,
                 "folder: refuse images declaring more pixels than this (checked from the header, before decoding)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31))
      ->group(g);
}

}  // namespace duet::app
