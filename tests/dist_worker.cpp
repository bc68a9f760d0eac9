// One rank of the data-parallel tests (tests/test_distributed.cpp starts it under mpirun, and
// alone for the one-process reference). It trains an MLP with the pieces `duet train` uses (the
// sharded loader, rank 0's weights broadcast, the bucketed gradient reducer) in f64 on the
// reference backend or f32 on the cpu backend, or evaluates one sharded, and rank 0 writes the
// result. Each rank initialises its weights from its own seed, so only the broadcast makes them
// equal.
//
//   dist_worker train <reference|cpu> <sgd|adamw> <batch per rank> <steps> <out.safetensors>
//   dist_worker eval <reference|cpu> <eval batch> <out.txt>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <fmt/format.h>
#include "train/evaluate.h"
#include "train/run_env.h"
#include "datasets/loader.h"
#include "datasets/synthetic.h"
#include "distributed/grad_reducer.h"
#include "distributed/sync.h"
#include "engine/duet.h"
#include "engine/optim/optimizer.h"
#include "engine/serialize.h"
#include "models/mlp.h"

using namespace duet;

namespace {
constexpr int64_t kTrain = 96, kTest = 70, kClasses = 5, kSide = 6;

std::shared_ptr<nn::Module> make_model(dist::Communicator& comm, DType dtype) {
  manual_seed(100 + static_cast<uint64_t>(comm.rank()));  // different on every rank on purpose
  auto model = models::mlp(kSide * kSide, kClasses, 24, 2);
  model->to(dtype);
  std::vector<Tensor> state = model->parameters();
  dist::broadcast_tensors(comm, state, 0);
  return model;
}

int train(dist::Communicator& comm, DType dtype, const std::string& optimizer, int64_t batch, int64_t steps,
          const std::string& out) {
  const datasets::SyntheticDataset data(kTrain, kClasses, 1, kSide, kSide, 5);
  auto model = make_model(comm, dtype);
  std::unique_ptr<optim::Optimizer> opt;
  if (optimizer == "sgd") opt = std::make_unique<optim::SGD>(model->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
  else opt = std::make_unique<optim::AdamW>(model->parameters(), optim::AdamWOptions{.lr = 0.01, .weight_decay = 0.05});
  datasets::LoaderOptions lo;
  lo.batch_size = batch;
  lo.seed = 9;
  lo.num_workers = 0;
  lo.rank = comm.rank();
  lo.world_size = comm.size();
  lo.drop_last = true;
  datasets::DataLoader loader(data, lo);
  // Small buckets, so that several all-reduces run during each backward.
  dist::GradReducer reducer(comm, model->parameters(), {.bucket_mb = 0.004});
  int64_t done = 0;
  for (int64_t epoch = 0; done < steps; ++epoch) {
    loader.start_epoch(epoch);
    datasets::Batch b;
    while (done < steps && loader.next(b)) {
      opt->zero_grad();
      const Tensor loss = cross_entropy((*model)(b.images.to(dtype)), b.labels);
      {
        const LeafGradHookGuard hook = reducer.watch_backward();
        loss.backward();
      }
      reducer.finish();
      opt->step();
      ++done;
    }
  }
  if (comm.rank() == 0) save_safetensors(out, model->named_parameters());
  return 0;
}

int eval(dist::Communicator& comm, int64_t batch, const std::string& out) {
  const datasets::SyntheticDataset test(kTest, kClasses, 1, kSide, kSide, 5, kTrain);
  auto model = make_model(comm, DType::f32);
  const app::EvalResult r =
      app::evaluate(*model, test, std::nullopt, {.batch_size = batch, .workers = 0, .comm = &comm});
  if (comm.rank() == 0) {
    std::ofstream f(out);
    f << fmt::format("loss {:a}\naccuracy {:a}\nimages {}\n", r.loss, r.accuracy, r.images);
    for (size_t k = 0; k < r.total_per_class.size(); ++k)
      f << fmt::format("class {} {}/{}\n", k, r.correct_per_class[k], r.total_per_class[k]);
  }
  return 0;
}
}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> a(argv + 1, argv + argc);
  dist::Communicator& comm = dist::world();
  try {
    DUET_CHECK(a.size() >= 2, "usage: dist_worker train|eval <backend> ...");
    // One thread in every process, the reference as well as the ranks: a kernel's reduction order
    // may depend on the thread count, and evaluation is compared bit for bit.
    app::GlobalOptions g;
    g.backend = a[1];
    g.threads = 1;
    app::apply_global_options(g);
    const DType dtype = a[1] == "reference" ? DType::f64 : DType::f32;
    if (a[0] == "train" && a.size() == 6) return train(comm, dtype, a[2], std::stoll(a[3]), std::stoll(a[4]), a[5]);
    if (a[0] == "eval" && a.size() == 4) return eval(comm, std::stoll(a[2]), a[3]);
    throw Error("usage: dist_worker train <backend> <sgd|adamw> <batch> <steps> <out> | eval <backend> <batch> <out>");
  } catch (const std::exception& e) {
    comm.abort(fmt::format("dist_worker: error on rank {} of {}: {}", comm.rank(), comm.size(), e.what()), 1);
  }
}
