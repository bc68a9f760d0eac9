// Dataset construction for train/eval/predict (see train_data.h).
#include "train/train_data.h"
#include <filesystem>
#include <fmt/format.h>
#include "datasets/cifar10.h"
#include "datasets/image_folder.h"
#include "datasets/synthetic.h"
#include "engine/error.h"
#include "train/val_split.h"

namespace duet::app {

namespace fs = std::filesystem;

namespace {

void check_path(const DataOptions& o, const std::string& expected) {
  DUET_CHECK(!o.path.empty(), "--dataset {} needs --data PATH: {}", o.dataset, expected);
  std::error_code ec;
  DUET_CHECK(fs::exists(o.path, ec), "dataset path '{}' does not exist; expected {}", o.path, expected);
  DUET_CHECK(fs::is_directory(o.path, ec), "dataset path '{}' is not a folder; expected {}", o.path, expected);
}

const char* kCifarLayout = "a folder containing data_batch_1.bin (.. data_batch_5.bin) and test_batch.bin";
const char* kFolderLayout = "a folder with train/ and test/, each holding one subfolder of .jpg/.png images per class";

nlohmann::json transform_json(int64_t resize, int64_t crop, const datasets::Normalization& n) {
  return {{"resize_shorter", resize}, {"center_crop", crop}, {"mean", n.mean}, {"std", n.std}};
}

datasets::Pipeline cifar_pipeline(const DataOptions& o, int64_t size, bool train) {
  datasets::Pipeline p{{}, datasets::cifar10_normalization()};
  if (size != 32) p.steps.push_back(datasets::resize_to(size, size));
  if (!train || o.no_augment) return p;
  const int64_t pad = o.crop_padding.value_or(4);
  p.steps.push_back(datasets::random_crop(size, pad));
  if (o.flip.value_or(true)) p.steps.push_back(datasets::random_horizontal_flip());
  return p;
}

datasets::Pipeline folder_train_pipeline(const DataOptions& o, int64_t size) {
  if (o.no_augment) return datasets::imagenet_eval_pipeline(size);
  datasets::Pipeline p{{}, datasets::imagenet_normalization()};
  if (o.crop_padding && !o.scale_min)
    p.steps.push_back(datasets::random_crop(size, *o.crop_padding));
  else
    p.steps.push_back(datasets::random_resized_crop(size, o.scale_min.value_or(0.08)));
  if (o.flip.value_or(true)) p.steps.push_back(datasets::random_horizontal_flip());
  return p;
}

std::shared_ptr<datasets::ImageFolder> open_folder(const DataOptions& o, const std::string& split, int64_t size) {
  const fs::path dir = fs::path(o.path) / split;
  std::error_code ec;
  DUET_CHECK(fs::is_directory(dir, ec), "dataset folder '{}' has no '{}' subfolder ('{}' not found); expected {}", o.path,
             split, dir.string(), kFolderLayout);
  datasets::ImageFolderOptions fo;
  fo.skip_bad = o.skip_bad;
  fo.image_size = size;
  // Decode and shrink each photo once; later epochs crop from the cached small copy.
  fo.resize_short_side = (size * 8 + 3) / 7;
  fo.cache = true;
  fo.max_pixels = o.max_image_pixels;
  return std::make_shared<datasets::ImageFolder>(dir.string(), fo);
}

std::string class_counts(const datasets::ImageDataset& ds) {
  std::vector<int64_t> n(static_cast<size_t>(ds.num_classes()), 0);
  for (int64_t i = 0; i < ds.size(); ++i) n[static_cast<size_t>(ds.label(i))]++;
  const auto names = ds.class_names();
  std::string s;
  for (size_t k = 0; k < n.size() && k < 12; ++k) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", names[k], n[k]);
  if (n.size() > 12) s += ", ...";
  return s;
}

TrainData make_data(const DataOptions& o, uint64_t seed, bool want_train, const std::string& eval_split) {
  TrainData d;
  DUET_CHECK(o.workers >= 0, "--workers {}: expected 0 or more", o.workers);
  if (o.dataset == "synthetic") {
    const int64_t s = o.image_size > 0 ? o.image_size : 32;
    d.image_size = s;
    const int64_t c = o.synthetic_classes;
    if (want_train || eval_split == "train") d.train = std::make_shared<datasets::SyntheticDataset>(o.train_size, c, 3, s, s, seed);
    d.test = eval_split == "train" ? d.train
                                   : std::make_shared<datasets::SyntheticDataset>(o.test_size, c, 3, s, s, seed, o.train_size);
    for (int64_t k = 0; k < c; ++k) d.class_names.push_back(fmt::format("class{}", k));
    d.summary = fmt::format("synthetic: {} train / {} test images {}x{}, {} classes (seed {})", o.train_size, o.test_size, s,
                            s, c, seed);
    return d;
  }
  if (o.dataset == "cifar10") {
    check_path(o, kCifarLayout);
    const int64_t s = o.image_size > 0 ? o.image_size : 32;
    d.image_size = s;
    std::shared_ptr<datasets::Cifar10> train, test;
    if (want_train || eval_split == "train") train = std::make_shared<datasets::Cifar10>(o.path, "train");
    test = eval_split == "train" ? train : std::make_shared<datasets::Cifar10>(o.path, "test");
    d.train = train;
    d.test = test;
    d.class_names = test->class_names();
    if (want_train) d.train_pipeline = cifar_pipeline(o, s, true);
    d.eval_pipeline = cifar_pipeline(o, s, false);
    d.eval_transform = transform_json(s, s, datasets::cifar10_normalization());
    d.summary = fmt::format("cifar10 '{}': {}{} test images {}x{}, 10 classes", o.path,
                            train ? fmt::format("{} train / ", train->size()) : "", test->size(), s, s);
    if (want_train) d.summary += "; augment: " + d.train_pipeline->describe();
    return d;
  }
  if (o.dataset == "folder") {
    check_path(o, kFolderLayout);
    const int64_t s = o.image_size > 0 ? o.image_size : 64;
    d.image_size = s;
    std::shared_ptr<datasets::ImageFolder> train, test;
    if (want_train || eval_split == "train") train = open_folder(o, "train", s);
    test = eval_split == "train" ? train : open_folder(o, "test", s);
    if (train && test)
      DUET_CHECK(train->class_names() == test->class_names(),
                 "dataset folder '{}': train/ has classes [{}] but test/ has [{}]; expected the same class folders in both",
                 o.path, fmt::join(train->class_names(), ", "), fmt::join(test->class_names(), ", "));
    d.train = train;
    d.test = test;
    d.class_names = test->class_names();
    if (want_train) d.train_pipeline = folder_train_pipeline(o, s);
    d.eval_pipeline = datasets::imagenet_eval_pipeline(s);
    d.eval_transform = transform_json((s * 8 + 3) / 7, s, datasets::imagenet_normalization());
    d.summary = fmt::format("folder '{}': {}{} test images at {}x{}, {} classes (test: {})", o.path,
                            train ? fmt::format("{} train / ", train->size()) : "", test->size(), s, s,
                            d.class_names.size(), class_counts(*test));
    if (want_train) d.summary += "; augment: " + d.train_pipeline->describe();
    return d;
  }
  throw Error(fmt::format("unknown dataset '{}': expected synthetic, cifar10 or folder", o.dataset));
}

}  // namespace

TrainData make_train_data(const DataOptions& o, uint64_t seed) {
  TrainData d = make_data(o, seed, true, "test");
  if (o.val_fraction > 0) hold_out_validation(d, o.val_fraction, seed);
  return d;
}

TrainData make_eval_data(const DataOptions& o, uint64_t seed, const std::string& split) {
  DUET_CHECK(split == "test" || split == "train" || split == "val", "split '{}': expected test, train or val", split);
  DUET_CHECK(split != "val" || o.val_fraction > 0,
             "split 'val': this model was trained without --val-fraction, so it has no validation split");
  TrainData d = make_data(o, seed, false, split == "val" ? "train" : split);
  if (split != "test" && o.val_fraction > 0) {  // the same split as the run's: same fraction, same seed
    hold_out_validation(d, o.val_fraction, seed);
    d.test = split == "val" ? d.val : d.train;
  }
  return d;
}

datasets::Pipeline pipeline_from_json(const nlohmann::json& t) {
  DUET_CHECK(t.is_object() && t.contains("center_crop"),
             "this model was trained on synthetic data, which has no image transform; predict needs a model trained on "
             "cifar10 or an image folder");
  datasets::Pipeline p;
  p.norm.mean = t.at("mean").get<std::vector<float>>();
  p.norm.std = t.at("std").get<std::vector<float>>();
  p.steps.push_back(datasets::resize_shorter(t.at("resize_shorter").get<int64_t>()));
  p.steps.push_back(datasets::center_crop(t.at("center_crop").get<int64_t>()));
  return p;
}

}  // namespace duet::app
