#include "apps/train_cmd.h"
#include <chrono>
#include <memory>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <omp.h>
#include "apps/op_table.h"
#include "datasets/synthetic.h"
#include "engine/duet.h"
#include "engine/optim/optimizer.h"
#include "models/mlp.h"
#include "models/small_cnn.h"

namespace duet::app {

void add_train_options(CLI::App& cmd, TrainOptions& o) {
  cmd.add_option("--model", o.model, "Model: small_cnn or mlp")->capture_default_str();
  cmd.add_option("--dataset", o.dataset, "Dataset: synthetic")->capture_default_str();
  cmd.add_option("--epochs", o.epochs, "Passes over the training set")->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--batch", o.batch, "Batch size")->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--lr", o.lr, "Learning rate (default: 0.05 for sgd, 0.002 for adam/adamw)");
  cmd.add_option("--optimizer", o.optimizer, "Optimizer")
      ->capture_default_str()
      ->check(CLI::IsMember({"sgd", "adam", "adamw"}));
  cmd.add_option("--momentum", o.momentum, "SGD momentum")->capture_default_str();
  cmd.add_option("--weight-decay", o.weight_decay, "Weight decay")->capture_default_str();
  cmd.add_option("--backend", o.backend, "CPU backend: cpu (oneDNN) or reference (plain loops)")
      ->check(CLI::IsMember({"cpu", "reference"}));
  cmd.add_option("--threads", o.threads, "CPU threads (0: all)")->capture_default_str()->check(CLI::NonNegativeNumber);
  cmd.add_option("--seed", o.seed, "Random seed (initialisation, data, shuffling)")->capture_default_str();
  cmd.add_flag("--profile", o.profile, "Profile the training steps and print per-op totals");
  cmd.add_option("--train-size", o.train_size, "Synthetic training images")->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--test-size", o.test_size, "Synthetic held-out images")->capture_default_str()->check(CLI::PositiveNumber);
  cmd.add_option("--image-size", o.image_size, "Synthetic image height and width")->capture_default_str()->check(CLI::Range(8, 1024));
  cmd.add_option("--classes", o.classes, "Synthetic classes")->capture_default_str()->check(CLI::Range(2, 1000));
}

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::shared_ptr<nn::Module> make_model(const std::string& name, int64_t classes, const Shape& image) {
  if (name == "small_cnn") return models::small_cnn(classes, image[0]);
  if (name == "mlp") return models::mlp(image[0] * image[1] * image[2], classes);
  throw Error(fmt::format("unknown model '{}': expected small_cnn or mlp", name));
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainOptions& o, const std::vector<Tensor>& params) {
  if (o.optimizer == "sgd")
    return std::make_unique<optim::SGD>(params, optim::SgdOptions{.lr = o.lr.value_or(0.05), .momentum = o.momentum,
                                                                  .weight_decay = o.weight_decay});
  if (o.optimizer == "adam")
    return std::make_unique<optim::Adam>(params, optim::AdamOptions{.lr = o.lr.value_or(2e-3), .weight_decay = o.weight_decay});
  if (o.optimizer == "adamw")
    return std::make_unique<optim::AdamW>(params, optim::AdamWOptions{.lr = o.lr.value_or(2e-3), .weight_decay = o.weight_decay});
  throw Error(fmt::format("unknown optimizer '{}': expected sgd, adam or adamw", o.optimizer));
}

int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const std::vector<int64_t> pred = argmax(logits.detach(), 1).to_vector<int64_t>();
  const std::vector<int64_t> truth = labels.to_vector<int64_t>();
  int64_t n = 0;
  for (size_t i = 0; i < pred.size(); ++i) n += pred[i] == truth[i];
  return n;
}

struct EvalResult {
  double loss = 0, accuracy = 0;
};

// Evaluation is left out of the profile so the table shows training steps only.
EvalResult evaluate(nn::Module& model, const datasets::Dataset& data, int64_t batch_size) {
  const bool profiling = profiler::enabled();
  profiler::enable(false);
  NoGradGuard no_grad;
  model.eval();
  std::vector<int64_t> order(static_cast<size_t>(data.size()));
  for (int64_t i = 0; i < data.size(); ++i) order[static_cast<size_t>(i)] = i;
  double loss_sum = 0;
  int64_t correct = 0;
  for (const auto& idx : datasets::batches_of(order, batch_size)) {
    const datasets::Batch b = data.batch(idx);
    const Tensor logits = model(b.images);
    loss_sum += cross_entropy(logits, b.labels).item() * static_cast<double>(idx.size());
    correct += count_correct(logits, b.labels);
  }
  model.train();
  profiler::enable(profiling);
  const double n = static_cast<double>(std::max<int64_t>(data.size(), 1));
  return {loss_sum / n, static_cast<double>(correct) / n};
}

std::string with_commas(int64_t v) {
  std::string s = std::to_string(v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return s;
}
}  // namespace

void run_train(const TrainOptions& o) {
  DUET_CHECK(o.dataset == "synthetic", "unknown dataset '{}': expected synthetic", o.dataset);
  if (o.threads > 0) omp_set_num_threads(o.threads);
  if (!o.backend.empty()) set_default_backend(DeviceType::cpu, backend_from_name(o.backend));
  manual_seed(o.seed);

  const datasets::SyntheticDataset train(o.train_size, o.classes, 3, o.image_size, o.image_size, o.seed);
  const datasets::SyntheticDataset test(o.test_size, o.classes, 3, o.image_size, o.image_size, o.seed, o.train_size);
  auto model = make_model(o.model, train.num_classes(), train.image_shape());
  auto opt = make_optimizer(o, model->parameters());

  fmt::print("model {} ({} parameters) | dataset synthetic: {} train / {} test images {}x{}, {} classes\n", o.model,
             with_commas(model->num_parameters()), train.size(), test.size(), o.image_size, o.image_size,
             train.num_classes());
  fmt::print("backend {} | threads {} | optimizer {} lr {} | batch {} | epochs {} | seed {}\n",
             backend_name(default_backend(DeviceType::cpu)), omp_get_max_threads(), opt->name(), opt->lr(), o.batch,
             o.epochs, o.seed);

  if (o.profile) {
    profiler::clear();
    profiler::enable(true);
  }
  double train_seconds = 0;
  int64_t steps = 0;
  for (int64_t epoch = 0; epoch < o.epochs; ++epoch) {
    model->train();
    const auto order = datasets::shuffled_indices(train.size(), o.seed * 1000003 + static_cast<uint64_t>(epoch));
    double loss_sum = 0;
    int64_t correct = 0, seen = 0;
    const auto t0 = Clock::now();
    for (const auto& idx : datasets::batches_of(order, o.batch)) {
      profiler::step_begin(steps, static_cast<int64_t>(idx.size()));
      datasets::Batch b;
      {
        profiler::PhaseGuard phase(Phase::data);
        b = train.batch(idx);
      }
      Tensor logits, loss;
      {
        profiler::PhaseGuard phase(Phase::forward);
        logits = (*model)(b.images);
        loss = cross_entropy(logits, b.labels);
      }
      opt->zero_grad();
      loss.backward();
      opt->step();
      profiler::step_end();
      ++steps;
      loss_sum += loss.item() * static_cast<double>(idx.size());
      correct += count_correct(logits, b.labels);
      seen += static_cast<int64_t>(idx.size());
    }
    const double secs = seconds_since(t0);
    train_seconds += secs;
    const EvalResult ev = evaluate(*model, test, o.batch);
    fmt::print("epoch {}/{}  loss {:.4f}  train acc {:5.1f}%  test loss {:.4f}  test acc {:5.1f}%  {:.0f} img/s  {:.2f} s\n",
               epoch + 1, o.epochs, loss_sum / static_cast<double>(seen), 100.0 * static_cast<double>(correct) / static_cast<double>(seen),
               ev.loss, 100.0 * ev.accuracy, static_cast<double>(seen) / secs, secs);
  }
  fmt::print("trained {} steps in {:.2f} s ({:.0f} img/s); chance accuracy is {:.1f}%\n", steps, train_seconds,
             static_cast<double>(steps > 0 ? o.train_size * o.epochs : 0) / train_seconds, 100.0 / static_cast<double>(o.classes));

  if (o.profile) {
    profiler::enable(false);
    const std::vector<OpEvent> events = profiler::collect();
    const std::vector<OpTotal> totals = op_totals(events);
    int64_t op_ns = 0;
    for (const OpTotal& t : totals) op_ns += t.ns;
    fmt::print("\nper-op totals over {} training steps (evaluation not profiled); ops cover {:.1f}% of {:.2f} s\n", steps,
               train_seconds > 0 ? 100.0 * static_cast<double>(op_ns) * 1e-9 / train_seconds : 0.0, train_seconds);
    fmt::print("{}", format_op_table(totals));
  }
}

}  // namespace duet::app
