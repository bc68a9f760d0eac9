// `duet train`: trains a model on a dataset and reports loss, accuracy and throughput per epoch;
// with --profile, a per-op totals table of the training steps.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace CLI {
class App;
}

namespace duet::app {

struct TrainOptions {
  std::string model = "small_cnn";  // small_cnn | mlp
  std::string dataset = "synthetic";
  int64_t epochs = 3;
  int64_t batch = 64;
  std::optional<double> lr;  // default: 0.05 for sgd, 0.002 for adam/adamw
  std::string optimizer = "sgd";
  double momentum = 0.9;
  double weight_decay = 5e-4;
  std::string backend;  // empty: the build's default CPU backend
  int threads = 0;      // 0: OpenMP's default
  uint64_t seed = 0;
  bool profile = false;
  int64_t train_size = 2048, test_size = 512, image_size = 32, classes = 10;
};

// Registers the options of `train` on its sub-command.
void add_train_options(CLI::App& cmd, TrainOptions& o);
// Runs the training; throws duet::Error on bad options.
void run_train(const TrainOptions& o);

}  // namespace duet::app
