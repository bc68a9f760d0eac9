// The validation split of a training run (see val_split.h).
#include "train/val_split.h"
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include "datasets/split.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "train/checkpoint.h"
#include "train/output_check.h"

namespace duet::app {

void hold_out_validation(TrainData& d, double fraction, uint64_t seed) {
  DUET_CHECK(d.train != nullptr, "--val-fraction: there is no training set to hold a validation split out of");
  const std::vector<int64_t> labels = datasets::dataset_labels(*d.train);
  datasets::SplitIndices s =
      datasets::stratified_split(labels, d.train->num_classes(), fraction, seed, d.class_names);
  const auto held = static_cast<int64_t>(s.val.size()), total = d.train->size();
  const std::shared_ptr<const datasets::Dataset> all = d.train;
  d.train = datasets::subset(all, std::move(s.train));
  d.val = datasets::subset(all, std::move(s.val));
  d.summary += fmt::format("; validation: {} of the {} training images held out (--val-fraction {:g}, stratified by "
                           "class, seed {})",
                           held, total, fraction, seed);
}

std::string best_checkpoint_path(const std::string& checkpoint) {
  const std::string ext = ".safetensors";
  if (checkpoint.size() > ext.size() && checkpoint.compare(checkpoint.size() - ext.size(), ext.size(), ext) == 0)
    return checkpoint.substr(0, checkpoint.size() - ext.size()) + ".best" + ext;
  return checkpoint + ".best";
}

bool BestOnValidation::update(int64_t epoch, double val_accuracy, const nn::Module& model) {
  if (epoch_ > 0 && val_accuracy <= accuracy_) return false;
  epoch_ = epoch;
  accuracy_ = val_accuracy;
  const NoGradGuard no_grad;
  weights_.clear();
  for (const auto& [name, p] : model.named_parameters()) weights_.push_back(p.detach().clone());
  for (const auto& [name, b] : model.named_buffers()) weights_.push_back(b.clone());
  return true;
}

void BestOnValidation::store(nlohmann::json& metrics) const {
  if (epoch_ == 0) return;
  metrics["best_epoch"] = epoch_;
  metrics["best_val_acc"] = accuracy_;
}

void BestOnValidation::load(const nlohmann::json& metrics) {
  weights_.clear();
  epoch_ = 0;
  accuracy_ = -1;
  if (!metrics.is_object() || !metrics.contains("best_epoch")) return;
  try {
    epoch_ = metrics.at("best_epoch").get<int64_t>();
    accuracy_ = metrics.at("best_val_acc").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(fmt::format("the checkpoint's best_epoch / best_val_acc metadata is malformed ({})", e.what()));
  }
}

bool BestOnValidation::with_best_weights(nn::Module& model, const std::string& best_file,
                                         const std::function<void()>& f) const {
  if (epoch_ == 0) return false;
  std::vector<Tensor> slots;
  for (const auto& [name, p] : model.named_parameters()) slots.push_back(p);
  for (const auto& [name, b] : model.named_buffers()) slots.push_back(b);
  std::vector<Tensor> own;
  {
    const NoGradGuard no_grad;
    for (const Tensor& t : slots) own.push_back(t.detach().clone());
    if (weights_.size() == slots.size()) {
      for (size_t i = 0; i < slots.size(); ++i) slots[i].copy_(weights_[i]);
    } else {
      std::error_code ec;
      if (best_file.empty() || !std::filesystem::exists(best_file, ec)) return false;
      load_state_dict(model, read_checkpoint(best_file).model, true);
    }
  }
  try {
    f();
  } catch (...) {
    const NoGradGuard no_grad;
    for (size_t i = 0; i < slots.size(); ++i) slots[i].copy_(own[i]);
    throw;
  }
  const NoGradGuard no_grad;
  for (size_t i = 0; i < slots.size(); ++i) slots[i].copy_(own[i]);
  return true;
}

nlohmann::json TestReport::to_json() const {
  return {{"test", true},         {"epoch", epoch},           {"best_epoch", best_epoch}, {"val_acc", val_accuracy},
          {"test_loss", result.loss}, {"test_acc", result.accuracy}, {"test_images", result.images},
          {"eval_seconds", result.seconds}};
}

std::string TestReport::line() const {
  const auto correct = static_cast<int64_t>(result.accuracy * static_cast<double>(result.images) + 0.5);
  return fmt::format("test split (evaluated once, {}): accuracy {:.2f}% ({}/{})  loss {:.4f}\n",
                     best ? fmt::format("with the weights of epoch {}, the best on validation at {:.2f}%", epoch,
                                        100.0 * val_accuracy)
                          : fmt::format("with the last epoch's weights, epoch {}: those of the best epoch on validation "
                                        "({}) were not kept",
                                        epoch, best_epoch),
                     100.0 * result.accuracy, correct, result.images, result.loss);
}

void append_test_record(const std::string& log, const TestReport& r) {
  if (log.empty()) return;
  std::ofstream f(log, std::ios::app);
  DUET_CHECK(f.good(), "--log '{}': cannot open the file for appending", log);
  f << (dump_lenient(r.to_json()) + "\n") << std::flush;
  DUET_CHECK(f.good(), "--log '{}': writing failed (disk full?)", log);
}

}  // namespace duet::app
