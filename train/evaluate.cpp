// The evaluation loop shared by the trainer and `duet eval`.
#include "train/evaluate.h"
#include <chrono>
#include <fmt/format.h>
#include "datasets/loader.h"
#include "engine/autograd.h"
#include "engine/functional.h"
#include "engine/profiler/events.h"

namespace duet::app {

ProfilerPause::ProfilerPause() {
  per_op_ = profiler::enabled();
  steps_ = profiler::recording() && !per_op_;
  if (per_op_) profiler::enable(false);
  if (steps_) profiler::enable_throughput(false);
}

ProfilerPause::~ProfilerPause() {
  if (per_op_) profiler::enable(true);
  if (steps_) profiler::enable_throughput(true);
}

Tensor prepare_input(const Tensor& images, Device device, MemoryFormat f) {
  Tensor x = images;
  if (x.dim() == 4 && !x.is_contiguous(f)) x = x.contiguous(f);
  if (x.device() != device) x = x.to(device);
  return x;
}

void place_model(nn::Module& model, Device device, MemoryFormat f) {
  model.to(device);
  model.to(f);
}

int64_t count_correct(const Tensor& logits, const Tensor& labels, std::vector<int64_t>* correct_per_class,
                      std::vector<int64_t>* total_per_class) {
  NoGradGuard no_grad;
  const std::vector<int64_t> pred = argmax(logits.detach(), 1).to(Device::cpu()).to_vector<int64_t>();
  const std::vector<int64_t> truth = labels.to(Device::cpu()).to_vector<int64_t>();
  int64_t n = 0;
  for (size_t i = 0; i < pred.size(); ++i) {
    const bool ok = pred[i] == truth[i];
    n += ok;
    const auto k = static_cast<size_t>(truth[i]);
    if (total_per_class && k < total_per_class->size()) (*total_per_class)[k]++;
    if (correct_per_class && ok && k < correct_per_class->size()) (*correct_per_class)[k]++;
  }
  return n;
}

EvalResult evaluate(nn::Module& model, const datasets::Dataset& data, const std::optional<datasets::Pipeline>& pipeline,
                    const EvalSetup& setup) {
  const auto t0 = std::chrono::steady_clock::now();
  ProfilerPause pause;
  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  // Read-only for the pass, so each weight is converted once, not at every batch.
  const nn::FrozenForInference frozen(model);
  datasets::LoaderOptions lo;
  lo.batch_size = setup.batch_size;
  lo.shuffle = false;
  lo.num_workers = setup.workers;
  lo.memory_format = setup.memory_format;
  const bool sharded = setup.comm != nullptr && setup.comm->size() > 1;
  if (sharded) {
    lo.rank = setup.comm->rank();
    lo.world_size = setup.comm->size();  // no drop_last: every sample is evaluated exactly once
  }
  datasets::DataLoader loader(data, lo, pipeline);
  loader.start_epoch(0);
  EvalResult r;
  const auto classes = static_cast<size_t>(data.num_classes());
  r.correct_per_class.assign(classes, 0);
  r.total_per_class.assign(classes, 0);
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<double> batch_loss;  // sharded: this rank's batches' loss sums, in its order
  datasets::Batch b;
  try {
    while (loader.next(b)) {
      const Tensor logits = model(prepare_input(b.images, setup.device, setup.memory_format));
      const Tensor labels = b.labels.to(setup.device);
      const auto n = b.labels.numel();
      const double batch_sum = cross_entropy(logits, labels).item() * static_cast<double>(n);
      loss_sum += batch_sum;
      if (sharded) batch_loss.push_back(batch_sum);
      correct += count_correct(logits, labels, &r.correct_per_class, &r.total_per_class);
      r.images += n;
    }
  } catch (...) {
    model.train(was_training);
    throw;
  }
  model.train(was_training);
  if (sharded) {
    // One all-reduce of every batch's loss sum (in global batch order, zeros where another rank
    // has it) and of the counts; the loss is then summed in one process's order, so it is equal
    // to one process's to the last bit, not just close.
    const int64_t ws = setup.comm->size(), rank = setup.comm->rank();
    const int64_t batches = (data.size() + setup.batch_size - 1) / setup.batch_size;
    std::vector<double> v(static_cast<size_t>(batches) + 2 + 2 * classes, 0.0);
    for (size_t k = 0; k < batch_loss.size(); ++k) v[static_cast<size_t>(rank + static_cast<int64_t>(k) * ws)] = batch_loss[k];
    double* counts = v.data() + batches;
    counts[0] = static_cast<double>(correct);
    counts[1] = static_cast<double>(r.images);
    for (size_t c = 0; c < classes; ++c) {
      counts[2 + c] = static_cast<double>(r.correct_per_class[c]);
      counts[2 + classes + c] = static_cast<double>(r.total_per_class[c]);
    }
    setup.comm->all_reduce_sum(v.data(), v.size());
    loss_sum = 0;
    for (int64_t k = 0; k < batches; ++k) loss_sum += v[static_cast<size_t>(k)];
    correct = static_cast<int64_t>(counts[0]);  // exact: counts are far below 2^53
    r.images = static_cast<int64_t>(counts[1]);
    for (size_t c = 0; c < classes; ++c) {
      r.correct_per_class[c] = static_cast<int64_t>(counts[2 + c]);
      r.total_per_class[c] = static_cast<int64_t>(counts[2 + classes + c]);
    }
  }
  const double n = static_cast<double>(std::max<int64_t>(r.images, 1));
  r.loss = loss_sum / n;
  r.accuracy = static_cast<double>(correct) / n;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::string format_per_class(const EvalResult& r, const std::vector<std::string>& class_names) {
  size_t width = 5;
  for (const auto& c : class_names) width = std::max(width, c.size());
  std::string s;
  for (size_t k = 0; k < r.total_per_class.size(); ++k) {
    const std::string name = k < class_names.size() ? class_names[k] : fmt::format("class{}", k);
    const int64_t t = r.total_per_class[k], c = r.correct_per_class[k];
    const double pct = t > 0 ? 100.0 * static_cast<double>(c) / static_cast<double>(t) : 0.0;
    s += fmt::format("  {:<{}}  {:6.2f}%  ({}/{})\n", name, width, pct, c, t);
  }
  return s;
}

}  // namespace duet::app
