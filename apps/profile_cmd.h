// `duet profile`: training steps of a zoo model on generated data that stays on the device, so a
// step is compute only (no decode, no augmentation, no host-to-device copy). With one batch size
// it prints the per-op profile of those steps (as `duet train --profile` does); with a list,
// `--batch 16,32,64,128`, it is the batch-size sweep: images/s, step time and peak memory per size.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <string>
#include <nlohmann/json.hpp>
#include "apps/command.h"
#include "apps/model_setup.h"
#include "engine/profiler/capture.h"
#include "reports/sweep.h"

namespace duet::app {

struct GlobalOptions;

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
  std::string out, trace;  // report (one batch size) or sweep (several) JSON; Chrome trace
};

struct ProfileRunResult {
  profiler::Capture capture;  // what the timed steps recorded
  nlohmann::json report;      // duet.profile/1 built from it
  profiler::SweepPoint point;
};

// Runs warmup + steps training steps of `model` at one batch size and returns the report of the
// timed ones. Exposed for tests; the command adds printing and files.
ProfileRunResult profile_batch(const ProfileConfig& c, const GlobalOptions& g, int64_t batch);

Command add_profile_command(CLI::App& app, GlobalOptions& g);

}  // namespace duet::app
