// `duet profile`'s measurement: training steps of a zoo model on generated data that stays on the
// device, so a step is compute only (no decode, no augmentation, no host-to-device copy), recorded
// by the profiler at one batch size. The command (cli/profile.cpp) prints the report, or runs one
// of these per batch size for a sweep.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <nlohmann/json.hpp>
#include "engine/nn/module.h"
#include "engine/profiler/capture.h"
#include "reports/sweep.h"
#include "train/model_setup.h"
#include "train/run_env.h"

namespace duet::app {

struct ProfileConfig {
  ModelConfig model;
  int64_t image_size = 0;      // 0: the model's default (32 for the CIFAR-style models)
  std::string batches = "64";  // "64" or "16,32,64"
  int64_t steps = 10;          // timed steps per batch size
  int64_t warmup = 2;          // untimed steps first (primitive caches, allocator, first touch)
  std::string optimizer = "sgd";
  std::string amp = "off";     // off | bf16 | fp16 (with loss scaling), as duet train's --amp
  std::string mode = "auto";  // per-op | throughput | auto (per-op for one batch size, throughput for a sweep)
  std::string memory_format = "auto";
  // Eval-mode forward passes without gradients (what `duet eval` and `duet predict` run per batch)
  // instead of training steps: a step is one forward and the top-1 class of every image.
  bool inference = false;
  std::string out, trace;  // report (one batch size) or sweep (several) JSON; Chrome trace
  std::string tensorboard;  // one batch size: TensorBoard event files into this folder
};

struct ProfileRunResult {
  profiler::Capture capture;  // what the timed steps recorded
  nlohmann::json report;      // duet.profile/1 built from it
  profiler::SweepPoint point;
  std::shared_ptr<nn::Module> model;  // after the last step, with its gradients
};

// Runs warmup + steps training steps (or inference passes) of `model` at one batch size and returns
// the report of the timed ones.
ProfileRunResult profile_batch(const ProfileConfig& c, const GlobalOptions& g, int64_t batch);

// The input size and class count a profile runs at: the options', else the model's defaults.
struct ProfileSizes {
  int64_t image_size = 0, classes = 0;
};
ProfileSizes profile_sizes(const ProfileConfig& c);
// The report's "run" line of a profile at `batch` (a sweep's caller replaces "batch" by the list).
nlohmann::json profile_run_config(const ProfileConfig& c, const RunEnv& env, const ProfileSizes& sz, int64_t batch,
                                  uint64_t seed);

}  // namespace duet::app
