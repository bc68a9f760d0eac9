// `duet train --val-fraction F`: a validation split held out of the training set (stratified by
// class, drawn from --seed: datasets/split.h), on which every epoch is evaluated and the best
// epoch chosen; the test split is then evaluated once, at the end of the run, with the best
// epoch's weights, so that the number reported for it was not used to pick anything.
//
// With --checkpoint FILE the best epoch's model is also written to FILE's ".best" sibling
// (catdog.safetensors -> catdog.best.safetensors: model and run metadata, no optimizer state), for
// `duet eval`, `duet predict` and `duet export`; FILE itself stays the latest epoch's, for --resume,
// and remembers the best epoch so that a resumed run keeps choosing among all of them.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>
#include "engine/nn/module.h"
#include "train/evaluate.h"
#include "train/train_data.h"

namespace duet::app {

// Replaces d.train by its training part and sets d.val to the held-out part (both views of the
// original training set; the validation part is evaluated with the eval transform). duet::Error
// for a fraction outside (0, 1) or a class the split would leave empty.
void hold_out_validation(TrainData& d, double fraction, uint64_t seed);

// FILE.safetensors -> FILE.best.safetensors (other names: FILE.best).
std::string best_checkpoint_path(const std::string& checkpoint);

// The best epoch on the validation split so far, and its weights.
class BestOnValidation {
public:
  // Whether `epoch` (1-based) beats the best so far on validation accuracy (a tie keeps the earlier
  // epoch); if so its parameters and buffers are copied (on their device) and kept.
  bool update(int64_t epoch, double val_accuracy, const nn::Module& model);
  int64_t epoch() const { return epoch_; }  // 0: none yet
  double accuracy() const { return accuracy_; }
  // What a checkpoint stores of it ("best_epoch", "best_val_acc" in its metrics), and reads back on
  // --resume (the weights then come from the best checkpoint file when they are needed).
  void store(nlohmann::json& metrics) const;
  void load(const nlohmann::json& metrics);
  // f() run with the best epoch's weights in `model`, the model's own weights put back afterwards:
  // the copy kept by update(), else (a resumed run whose best epoch came before the resume) those of
  // `best_file`. Returns false, without running f, when neither has them.
  bool with_best_weights(nn::Module& model, const std::string& best_file, const std::function<void()>& f) const;

private:
  int64_t epoch_ = 0;
  double accuracy_ = -1;
  std::vector<Tensor> weights_;  // parameters, then buffers, in named_* order
};

// The test split's one evaluation at the end of a run with a validation split.
struct TestReport {
  int64_t epoch = 0;          // whose weights were evaluated (1-based)
  bool best = true;           // the best epoch on validation (else: the last epoch, the best's weights being lost)
  double val_accuracy = 0;    // that epoch's validation accuracy
  int64_t best_epoch = 0;     // the best epoch on validation
  EvalResult result;
  nlohmann::json to_json() const;  // the record --log appends after the epochs' ("test": true)
  std::string line() const;        // the line the run prints
};

// Appends r.to_json() to the JSONL log (one write, as the epochs' lines).
void append_test_record(const std::string& log, const TestReport& r);

}  // namespace duet::app
