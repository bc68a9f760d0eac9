// `duet train --val-fraction F` (train/val_split.h, datasets/split.h): the split is stratified,
// reproducible from the seed and disjoint from what is trained on; the best epoch is chosen on the
// validation split (a tie keeps the earlier one) and its weights are those the test split is
// evaluated with, once, at the end of the run (also after a resume); bad fractions and splits that
// would leave a class empty are errors that name the class.
#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include "datasets/split.h"
#include "datasets/synthetic.h"
#include "engine/serialize.h"
#include "models/small_cnn.h"
#include "tests/cli_support.h"
#include "tests/test_support.h"
#include "tests/trainer_config.h"
#include "train/checkpoint.h"
#include "train/model_file.h"
#include "train/model_setup.h"
#include "train/trainer.h"
#include "train/val_split.h"

using namespace duet;
using namespace duet::app;
using duet::testing::CliResult;
using duet::testing::contains;
using duet::testing::duet_cli;
namespace fs = std::filesystem;

namespace {

fs::path temp_dir(const std::string& name) { return duet::testing::fresh_temp_dir("test_val_" + name); }

// Labels 0 x50, 1 x30, 2 x20, interleaved.
std::vector<int64_t> three_classes() {
  std::vector<int64_t> labels;
  for (int i = 0; i < 100; ++i) labels.push_back(i % 10 < 5 ? 0 : i % 10 < 8 ? 1 : 2);
  return labels;
}

std::map<int64_t, int64_t> counts(const std::vector<int64_t>& labels, const std::vector<int64_t>& idx) {
  std::map<int64_t, int64_t> n;
  for (int64_t i : idx) n[labels[static_cast<size_t>(i)]]++;
  return n;
}

// Every sample's pixels, as strings, for comparing datasets by content.
std::vector<std::string> images_of(const datasets::Dataset& ds) {
  std::vector<int64_t> all;
  for (int64_t i = 0; i < ds.size(); ++i) all.push_back(i);
  const datasets::Batch b = ds.batch(all);
  const std::vector<float> px = b.images.contiguous().to_vector<float>();
  const size_t per = px.size() / static_cast<size_t>(ds.size());
  std::vector<std::string> out;
  for (size_t i = 0; i < static_cast<size_t>(ds.size()); ++i)
    out.emplace_back(reinterpret_cast<const char*>(px.data() + i * per), per * sizeof(float));
  return out;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

TrainConfig val_config() {
  TrainConfig c = duet::testing::tiny_train_config();
  c.data.val_fraction = 0.25;  // 30 of the 120 training images
  c.epochs = 4;
  return c;
}

struct TrainRun {
  TrainResult result;
  std::vector<EpochMetrics> epochs;  // every on_epoch_end
  std::string output;
};

struct Recorder final : TrainCallback {
  std::vector<EpochMetrics>* out;
  explicit Recorder(std::vector<EpochMetrics>* o) : out(o) {}
  void on_epoch_end(const EpochMetrics& m) override { out->push_back(m); }
};

TrainRun train(TrainConfig c) {
  BackendGuard backend(DeviceType::cpu, default_backend(DeviceType::cpu));
  RunEnv env;
  manual_seed(c.seed);
  TrainData data = make_train_data(c.data, c.seed);
  c.model.classes = static_cast<int64_t>(data.class_names.size());
  auto model = build_model(c.model, c.model.classes, data.image_size);
  std::ostringstream out;
  TrainRun r;
  Trainer t(c, env, std::move(data), model, out);
  t.add_callback(std::make_shared<Recorder>(&r.epochs));
  r.result = t.fit();
  r.output = out.str();
  return r;
}

}  // namespace

TEST(ValSplit, StratifiedDisjointAndComplete) {
  const std::vector<int64_t> labels = three_classes();
  const datasets::SplitIndices s = datasets::stratified_split(labels, 3, 0.2, 11);
  EXPECT_EQ(counts(labels, s.val), (std::map<int64_t, int64_t>{{0, 10}, {1, 6}, {2, 4}}));
  EXPECT_EQ(counts(labels, s.train), (std::map<int64_t, int64_t>{{0, 40}, {1, 24}, {2, 16}}));
  std::set<int64_t> seen(s.train.begin(), s.train.end());
  for (int64_t i : s.val) EXPECT_TRUE(seen.insert(i).second) << "sample " << i << " is in both parts";
  EXPECT_EQ(seen.size(), labels.size());
  EXPECT_TRUE(std::is_sorted(s.train.begin(), s.train.end()));
  EXPECT_TRUE(std::is_sorted(s.val.begin(), s.val.end()));
  // round(f * n) per class: 0.25 of 30 is 7.5 -> 8.
  EXPECT_EQ(counts(labels, datasets::stratified_split(labels, 3, 0.25, 11).val)[1], 8);
}

TEST(ValSplit, SameSeedSameSplitOtherSeedOtherSplit) {
  const std::vector<int64_t> labels = three_classes();
  const auto a = datasets::stratified_split(labels, 3, 0.2, 5), b = datasets::stratified_split(labels, 3, 0.2, 5);
  EXPECT_EQ(a.val, b.val);
  EXPECT_EQ(a.train, b.train);
  const auto c = datasets::stratified_split(labels, 3, 0.2, 6);
  EXPECT_NE(a.val, c.val);
  EXPECT_EQ(counts(labels, c.val), counts(labels, a.val));  // still stratified the same way
  // A class's draw does not depend on the other classes: dropping class 2 keeps class 0's split.
  std::vector<int64_t> two = labels;
  for (int64_t& l : two) l = l == 2 ? 1 : l;
  const auto d = datasets::stratified_split(two, 3 - 1, 0.2, 5);
  std::vector<int64_t> a0, d0;
  for (int64_t i : a.val) if (labels[static_cast<size_t>(i)] == 0) a0.push_back(i);
  for (int64_t i : d.val) if (two[static_cast<size_t>(i)] == 0) d0.push_back(i);
  EXPECT_EQ(a0, d0);
}

TEST(ValSplit, BadFractionsAndEmptyClassesAreErrors) {
  const std::vector<int64_t> labels = three_classes();
  for (double f : {0.0, 1.0, -0.1, 1.5, std::nan("")})
    EXPECT_ERROR_HAS(datasets::stratified_split(labels, 3, f, 1), "--val-fraction", "strictly between 0 and 1");
  // 20 samples of 'owl': 0.02 of them rounds to none.
  EXPECT_ERROR_HAS(datasets::stratified_split(labels, 3, 0.02, 1, {"cat", "dog", "owl"}),
                   "leaves class 'owl' (20 training samples) without a validation sample", "at least 0.025");
  EXPECT_ERROR_HAS(datasets::stratified_split(labels, 3, 0.99, 1, {"cat", "dog", "owl"}),
                   "leaves class 'cat' (50 training samples) with nothing to train on");
  EXPECT_ERROR_HAS(datasets::stratified_split(labels, 4, 0.2, 1, {"cat", "dog", "owl", "emu"}),
                   "class 'emu' has no training samples");
}

// make_train_data: train and validation are disjoint parts of the training set, by content; the
// same seed gives the same split, another seed another; `duet eval --split val` rebuilds it.
TEST(ValSplit, TrainDataHoldsOutDisjointImages) {
  TrainConfig c = val_config();
  const TrainData d = make_train_data(c.data, c.seed);
  ASSERT_TRUE(d.val != nullptr);
  EXPECT_EQ(d.train->size() + d.val->size(), 120);
  EXPECT_EQ(d.val->size(), 32);  // 4 classes of about 30: round(0.25 n) each
  EXPECT_TRUE(contains(d.summary, "validation: 32 of the 120 training images held out")) << d.summary;
  const std::vector<std::string> train = images_of(*d.train), val = images_of(*d.val);
  const std::set<std::string> train_set(train.begin(), train.end());
  for (const std::string& v : val) EXPECT_EQ(train_set.count(v), 0u) << "a validation image is also trained on";
  EXPECT_EQ(images_of(*make_train_data(c.data, c.seed).val), val);
  EXPECT_NE(images_of(*make_train_data(c.data, c.seed + 1).val), val);
  const TrainData e = make_eval_data(c.data, c.seed, "val");
  EXPECT_EQ(images_of(*e.test), val);
  EXPECT_EQ(images_of(*make_eval_data(c.data, c.seed, "train").test), train);
  c.data.val_fraction = 0;
  EXPECT_EQ(make_train_data(c.data, c.seed).val, nullptr);
  EXPECT_ERROR_HAS(make_eval_data(c.data, c.seed, "val"), "trained without --val-fraction");
}

// The best epoch: the highest validation accuracy, the earlier one on a tie; its weights (not the
// last epoch's) are what with_best_weights() runs with, and the model's own come back afterwards.
TEST(ValSplit, BestEpochIsChosenOnValidationAccuracy) {
  models::SmallCNN model(2, 3, 4);
  BestOnValidation best;
  const std::vector<double> acc{0.50, 0.70, 0.60, 0.70};
  for (size_t e = 0; e < acc.size(); ++e) {
    for (const Tensor& p : model.parameters()) p.fill_(static_cast<double>(e + 1));  // the weights say their epoch
    best.update(static_cast<int64_t>(e + 1), acc[e], model);
  }
  EXPECT_EQ(best.epoch(), 2);
  EXPECT_DOUBLE_EQ(best.accuracy(), 0.70);
  double seen = 0;
  EXPECT_TRUE(best.with_best_weights(model, "", [&] { seen = model.parameters()[0].detach().to_vector<float>()[0]; }));
  EXPECT_EQ(seen, 2.0);
  EXPECT_EQ(model.parameters()[0].detach().to_vector<float>()[0], 4.0f);  // the last epoch's, back

  // After a resume the choice is remembered and the weights come from the best checkpoint file.
  const fs::path dir = temp_dir("best");
  nlohmann::json metrics;
  best.store(metrics);
  EXPECT_EQ(metrics["best_epoch"], 2);
  for (const Tensor& p : model.parameters()) p.fill_(2.0);
  save_checkpoint((dir / "ck.best.safetensors").string(), model, nullptr, CheckpointState{.epoch = 2});
  for (const Tensor& p : model.parameters()) p.fill_(4.0);
  BestOnValidation resumed;
  resumed.load(metrics);
  EXPECT_EQ(resumed.epoch(), 2);
  EXPECT_FALSE(resumed.update(3, 0.65, model));
  EXPECT_FALSE(resumed.with_best_weights(model, (dir / "missing.safetensors").string(), [] {}));
  EXPECT_TRUE(resumed.with_best_weights(model, (dir / "ck.best.safetensors").string(),
                                        [&] { seen = model.parameters()[0].detach().to_vector<float>()[0]; }));
  EXPECT_EQ(seen, 2.0);
  EXPECT_EQ(model.parameters()[0].detach().to_vector<float>()[0], 4.0f);
  fs::remove_all(dir);
}

// A run with a validation split: every epoch evaluated on it (not on the test split), the best
// one written to FILE.best, and the test split evaluated once, at the end, with those weights.
TEST(ValSplit, TrainingChoosesOnValidationAndTestsOnceAtTheEnd) {
  const fs::path dir = temp_dir("run");
  TrainConfig c = val_config();
  c.checkpoint = (dir / "ck.safetensors").string();
  c.log = (dir / "log.jsonl").string();
  const TrainRun r = train(c);
  ASSERT_EQ(r.epochs.size(), 4u);
  size_t best = 0;
  for (size_t e = 0; e < r.epochs.size(); ++e) {
    EXPECT_TRUE(r.epochs[e].has_val);
    EXPECT_EQ(r.epochs[e].test_accuracy, 0.0) << "epoch " << e + 1 << " was evaluated on the test split";
    if (r.epochs[e].val_accuracy > r.epochs[best].val_accuracy) best = e;
  }
  ASSERT_TRUE(r.result.test.has_value());
  const TestReport& t = *r.result.test;
  EXPECT_TRUE(t.best);
  EXPECT_EQ(t.epoch, static_cast<int64_t>(best + 1));
  EXPECT_EQ(t.val_accuracy, r.epochs[best].val_accuracy);
  EXPECT_EQ(t.result.images, 32);  // the whole test split
  EXPECT_TRUE(contains(r.output, "val acc")) << r.output;
  EXPECT_FALSE(contains(r.output, "test acc")) << r.output;

  // The best checkpoint holds that epoch, and its weights give that test accuracy.
  const std::string best_file = best_checkpoint_path(c.checkpoint);
  EXPECT_EQ(best_file, (dir / "ck.best.safetensors").string());
  TrainedModel m = load_trained_model(best_file);
  EXPECT_EQ(m.epoch, static_cast<int64_t>(best + 1));
  const MemoryFormat format = input_memory_format(c.data.memory_format, RunEnv{});  // as the run evaluated
  place_model(*m.model, Device::cpu(), format);
  const EvalSetup setup{.memory_format = format};
  const TrainData test = make_eval_data(m.config.data, m.config.seed, "test");
  EXPECT_NEAR(evaluate(*m.model, *test.test, test.eval_pipeline, setup).accuracy, t.result.accuracy, 1e-12);
  const TrainData val = make_eval_data(m.config.data, m.config.seed, "val");
  EXPECT_NEAR(evaluate(*m.model, *val.test, val.eval_pipeline, setup).accuracy, r.epochs[best].val_accuracy, 1e-12);

  // The log: the epochs' validation numbers, then one test record.
  const std::vector<nlohmann::json> log = read_jsonl(c.log);
  ASSERT_EQ(log.size(), 5u);
  for (size_t e = 0; e < 4; ++e) {
    EXPECT_TRUE(log[e].contains("val_acc")) << log[e];
    EXPECT_FALSE(log[e].contains("test_acc")) << log[e];
  }
  EXPECT_EQ(log[4]["test"], true);
  EXPECT_EQ(log[4]["epoch"], static_cast<int64_t>(best + 1));
  EXPECT_DOUBLE_EQ(log[4]["test_acc"].get<double>(), t.result.accuracy);
  fs::remove_all(dir);
}

// A planned stop (--stop-after-epochs) is not the end: no test then; the resumed run tests once at
// its end, choosing among all epochs, those before the resume included.
TEST(ValSplit, ResumedRunTestsOnceAtItsEnd) {
  const fs::path dir = temp_dir("resume");
  TrainConfig c = val_config();
  c.checkpoint = (dir / "ck.safetensors").string();
  c.log = (dir / "log.jsonl").string();
  TrainConfig first = c;
  first.stop_after_epochs = 2;
  const TrainRun a = train(first);
  EXPECT_EQ(a.epochs.size(), 2u);
  EXPECT_FALSE(a.result.test.has_value());
  TrainConfig second = c;
  second.resume = c.checkpoint;
  const TrainRun b = train(second);
  ASSERT_EQ(b.epochs.size(), 2u);
  ASSERT_TRUE(b.result.test.has_value());
  std::vector<double> acc{a.epochs[0].val_accuracy, a.epochs[1].val_accuracy, b.epochs[0].val_accuracy,
                          b.epochs[1].val_accuracy};
  const auto best = static_cast<int64_t>(std::max_element(acc.begin(), acc.end()) - acc.begin()) + 1;
  EXPECT_EQ(b.result.test->epoch, best);
  EXPECT_TRUE(b.result.test->best);
  // The uninterrupted run chooses the same epoch and gets the same test accuracy.
  const TrainRun whole = train(val_config());
  EXPECT_EQ(whole.result.test->epoch, best);
  EXPECT_EQ(whole.result.test->result.accuracy, b.result.test->result.accuracy);
  size_t tests = 0;
  for (const nlohmann::json& j : read_jsonl(c.log)) tests += j.value("test", false);
  EXPECT_EQ(tests, 1u);
  // Another fraction cannot resume this run.
  TrainConfig other = second;
  other.data.val_fraction = 0.5;
  EXPECT_ERROR_HAS(train(other), "--val-fraction");
  fs::remove_all(dir);
}

TEST(ValSplit, CommandLine) {
  for (const char* bad : {"0", "1", "1.5"}) {
    const CliResult r = duet_cli({"train", "--dataset", "synthetic", "--epochs", "1", "--val-fraction", bad});
    EXPECT_NE(r.status, 0) << bad;
    EXPECT_TRUE(contains(r.err, "strictly between 0 and 1")) << r.err;
  }
  // 64 images of 10 classes: about 6 a class, and 0.05 of 6 rounds to none.
  const CliResult small = duet_cli({"train", "--dataset", "synthetic", "--train-size", "64", "--epochs", "1",
                                    "--val-fraction", "0.05"});
  EXPECT_EQ(small.status, 1);
  EXPECT_TRUE(contains(small.err, "without a validation sample")) << small.err;
  EXPECT_EQ(small.out.find("epoch 1/1"), std::string::npos);

  const fs::path dir = temp_dir("cli");
  const std::string ck = (dir / "ck.safetensors").string();
  const CliResult r = duet_cli({"train", "--dataset", "synthetic", "--image-size", "8", "--train-size", "64",
                                "--test-size", "16", "--classes", "2", "--width-mult", "0.25", "--batch", "16",
                                "--epochs", "2", "--val-fraction", "0.25", "--checkpoint", ck});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(contains(r.out, "validation: 16 of the 64 training images held out")) << r.out;
  EXPECT_TRUE(contains(r.out, "test split (evaluated once, with the weights of epoch")) << r.out;
  EXPECT_TRUE(contains(r.out, "ck.best.safetensors")) << r.out;
  const CliResult e = duet_cli({"eval", (dir / "ck.best.safetensors").string(), "--split", "val"});
  ASSERT_EQ(e.status, 0) << e.err;
  EXPECT_TRUE(contains(e.out, "/16)")) << e.out;  // the 16 validation images
  fs::remove_all(dir);
}
