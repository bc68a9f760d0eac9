// Evaluation of a classifier over a whole dataset split: loss, accuracy and per-class accuracy,
// in eval mode under NoGradGuard, through the same loader and input layout as training.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include "datasets/dataset.h"
#include "datasets/transforms.h"
#include "distributed/communicator.h"
#include "engine/nn/module.h"

namespace duet::app {

struct EvalResult {
  double loss = 0, accuracy = 0;
  int64_t images = 0;
  std::vector<int64_t> correct_per_class, total_per_class;
  double seconds = 0;
};

struct EvalSetup {
  int64_t batch_size = 256;
  int workers = 2;
  Device device = Device::cpu();
  MemoryFormat memory_format = MemoryFormat::contiguous;
  // Data-parallel: each rank evaluates its share of the batches (b = rank, rank + W, ...) and the
  // sums are all-reduced; loss, accuracy and counts come out as one process's, bit for bit, when
  // the ranks compute each batch as one process would.
  dist::Communicator* comm = nullptr;
};

// Batch images moved to the device in the layout the run uses (a no-op when they already are).
Tensor prepare_input(const Tensor& images, Device device, MemoryFormat f);
// The model moved to the device, its convolution weights in the inputs' layout f (PyTorch's
// model.to(memory_format=...)): a channels-last run then copies no weight or weight gradient to
// change its layout.
void place_model(nn::Module& model, Device device, MemoryFormat f);
// Correct predictions (argmax of logits [N, C]) among labels [N]; adds to the per-class counters
// when they are given (sized num_classes).
int64_t count_correct(const Tensor& logits, const Tensor& labels, std::vector<int64_t>* correct_per_class = nullptr,
                      std::vector<int64_t>* total_per_class = nullptr);

// The model's train/eval mode is restored afterwards. A profiling session is paused meanwhile, so
// evaluation does not land in the training profile.
EvalResult evaluate(nn::Module& model, const datasets::Dataset& data, const std::optional<datasets::Pipeline>& pipeline,
                    const EvalSetup& setup);

// Per-class accuracy lines ("  cat       87.3%  (131/150)"), one per class.
std::string format_per_class(const EvalResult& r, const std::vector<std::string>& class_names);

// Pauses profiler recording for its lifetime (per-op or throughput, whichever was on).
class ProfilerPause {
public:
  ProfilerPause();
  ~ProfilerPause();
  ProfilerPause(const ProfilerPause&) = delete;
  ProfilerPause& operator=(const ProfilerPause&) = delete;

private:
  bool per_op_ = false, steps_ = false;
};

}  // namespace duet::app
