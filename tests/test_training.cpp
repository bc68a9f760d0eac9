// End to end: the small CNN learns the synthetic task on the reference backend (tiny images, so
// the plain loops stay fast) and on the build's default backend, and training is reproducible.
#include <chrono>
#include "datasets/synthetic.h"
#include "engine/nn/layers.h"
#include "engine/optim/optimizer.h"
#include "models/mlp.h"
#include "models/small_cnn.h"
#include "tests/test_support.h"

using namespace duet;

namespace {
struct TrainRun {
  std::vector<double> epoch_loss;  // mean training loss per epoch
  double first_loss = 0;           // loss of the first batch, before any update
  double test_accuracy = 0;
  double seconds = 0;
};

struct TrainSetup {
  int64_t image = 8, n_train = 1536, n_test = 256, classes = 4, width = 8, batch = 32;
  int epochs = 4;
  double lr = 0.05;
  uint64_t seed = 1;
  bool mlp = false;
};

TrainRun train(const TrainSetup& s) {
  const auto t0 = std::chrono::steady_clock::now();
  manual_seed(s.seed);
  const datasets::SyntheticDataset train_set(s.n_train, s.classes, 3, s.image, s.image, s.seed);
  const datasets::SyntheticDataset test_set(s.n_test, s.classes, 3, s.image, s.image, s.seed, s.n_train);
  std::shared_ptr<nn::Module> model = s.mlp ? models::mlp(3 * s.image * s.image, s.classes, 64, 1)
                                            : models::small_cnn(s.classes, 3, s.width);
  optim::SGD opt(model->parameters(), {.lr = s.lr, .momentum = 0.9, .weight_decay = 5e-4});
  TrainRun r;
  for (int epoch = 0; epoch < s.epochs; ++epoch) {
    model->train();
    double total = 0;
    int64_t seen = 0;
    for (const auto& idx : datasets::batches_of(datasets::shuffled_indices(s.n_train, s.seed + epoch), s.batch)) {
      const datasets::Batch b = train_set.batch(idx);
      const Tensor loss = cross_entropy((*model)(b.images), b.labels);
      if (epoch == 0 && seen == 0) r.first_loss = loss.item();
      opt.zero_grad();
      loss.backward();
      opt.step();
      total += loss.item() * static_cast<double>(idx.size());
      seen += static_cast<int64_t>(idx.size());
    }
    r.epoch_loss.push_back(total / static_cast<double>(seen));
  }
  NoGradGuard no_grad;
  model->eval();
  std::vector<int64_t> all(static_cast<size_t>(s.n_test));
  for (int64_t i = 0; i < s.n_test; ++i) all[static_cast<size_t>(i)] = i;
  const datasets::Batch b = test_set.batch(all);
  const std::vector<int64_t> pred = argmax((*model)(b.images), 1).to_vector<int64_t>();
  const std::vector<int64_t> truth = b.labels.to_vector<int64_t>();
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i];
  r.test_accuracy = static_cast<double>(correct) / static_cast<double>(pred.size());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string describe(const TrainRun& r) {
  std::string s = fmt::format("first batch loss {:.3f}; epoch losses", r.first_loss);
  for (double l : r.epoch_loss) s += fmt::format(" {:.3f}", l);
  return s + fmt::format("; test accuracy {:.1f}%; {:.1f} s", 100 * r.test_accuracy, r.seconds);
}
}  // namespace

TEST(Training, SmallCnnLearnsOnReferenceBackend) {
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  const TrainSetup s;
  const TrainRun r = train(s);
  std::printf("reference backend, %lldx%lld: %s\n", static_cast<long long>(s.image), static_cast<long long>(s.image),
              describe(r).c_str());
  EXPECT_LT(r.epoch_loss.back(), 0.5 * r.first_loss) << describe(r);
  EXPECT_LT(r.epoch_loss.back(), r.epoch_loss.front()) << describe(r);
  EXPECT_GT(r.test_accuracy, 0.65) << "chance is 25%; " << describe(r);
}

TEST(Training, SmallCnnLearnsOnDefaultBackend) {
  if (default_backend(DeviceType::cpu) == Backend::reference)
    GTEST_SKIP() << "the default CPU backend is the reference backend (no oneDNN in this build); "
                    "SmallCnnLearnsOnReferenceBackend covers it";
  TrainSetup s;
  s.image = 16;
  s.classes = 10;
  s.n_train = 1024;
  s.width = 16;
  s.epochs = 3;
  const TrainRun r = train(s);
  std::printf("%s backend, 16x16: %s\n", backend_name(default_backend(DeviceType::cpu)), describe(r).c_str());
  EXPECT_LT(r.epoch_loss.back(), 0.5 * r.first_loss) << describe(r);
  EXPECT_GT(r.test_accuracy, 0.5) << "chance is 10%; " << describe(r);
}

TEST(Training, MlpLearnsOnReferenceBackend) {
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  TrainSetup s;
  s.mlp = true;
  s.epochs = 5;
  s.lr = 0.02;
  const TrainRun r = train(s);
  EXPECT_LT(r.epoch_loss.back(), r.epoch_loss.front()) << describe(r);
  EXPECT_GT(r.test_accuracy, 0.6) << "chance is 25%; " << describe(r);
}

TEST(Training, ReproducibleFromSeed) {
  BackendGuard ref(DeviceType::cpu, Backend::reference);
  TrainSetup s;
  s.epochs = 1;
  s.n_train = 128;
  s.n_test = 32;
  const TrainRun a = train(s), b = train(s);
  EXPECT_EQ(a.epoch_loss, b.epoch_loss);
  EXPECT_EQ(a.test_accuracy, b.test_accuracy);
}

TEST(SyntheticDataset, SplitsShareClassesButNotImages) {
  const datasets::SyntheticDataset a(20, 5, 3, 8, 8, 42), b(20, 5, 3, 8, 8, 42, 20), c(40, 5, 3, 8, 8, 42);
  EXPECT_EQ(a.size(), 20);
  EXPECT_EQ(a.image_shape(), (Shape{3, 8, 8}));
  const datasets::Batch ba = a.batch({0, 3, 19}), bb = b.batch({0}), bc = c.batch({20, 3});
  EXPECT_EQ(ba.images.shape(), (Shape{3, 3, 8, 8}));
  EXPECT_EQ(ba.labels.dtype(), DType::i64);
  EXPECT_EQ(ba.labels.to_vector<int64_t>(), (std::vector<int64_t>{0, 3, 4}));
  // Image 20 of the task is b's first image and c's 21st.
  EXPECT_TRUE(duet::testing::all_close(bb.images.select(0, 0), bc.images.select(0, 0), 0, 0));
  EXPECT_TRUE(duet::testing::all_close(ba.images.select(0, 1), bc.images.select(0, 1), 0, 0));
  // Roughly normalised.
  const datasets::SyntheticDataset big(256, 10, 3, 16, 16, 1);
  std::vector<int64_t> idx(256);
  for (int64_t i = 0; i < 256; ++i) idx[static_cast<size_t>(i)] = i;
  const Tensor x = big.batch(idx).images;
  EXPECT_NEAR(mean(x).item(), 0.0, 0.2);
  EXPECT_NEAR(std::sqrt(mean(square(x)).item()), 1.0, 0.25);
  EXPECT_THROW(a.batch({20}), Error);
  EXPECT_THROW(datasets::SyntheticDataset(10, 1, 3, 8, 8, 0), Error);

  const auto order = datasets::shuffled_indices(10, 3);
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_NE(order, datasets::shuffled_indices(10, 4));
  const auto batches = datasets::batches_of(order, 4);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[2].size(), 2u);
  EXPECT_EQ(datasets::batches_of(order, 4, true).size(), 2u);
}
