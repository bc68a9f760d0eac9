// Data pipeline throughput: decode + augment images/s of one worker (make_batch on the calling
// thread) for CIFAR-10 records and the cat/dog JPEGs, and whole-loader throughput with N workers.
// Reads the shared data folder from DUET_DATA_DIR (default: the build's DUET_DATA_DIR); skips a
// benchmark whose files are absent.
//
//   DUET_DATA_DIR=../shared/data duet_bench_loader --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <numeric>
#include "datasets/cifar10.h"
#include "datasets/image_folder.h"
#include "datasets/loader.h"

namespace duet::datasets {
namespace {

std::string data_dir() {
  const char* env = std::getenv("DUET_DATA_DIR");
  if (env && *env) return env;
#ifdef DUET_DEFAULT_DATA_DIR
  return DUET_DEFAULT_DATA_DIR;
#else
  return "";
#endif
}

const Cifar10* cifar() {
  static std::unique_ptr<Cifar10> ds = [] {
    const std::string f = data_dir() + "/cifar10/data_batch_1.bin";
    return std::filesystem::exists(f) ? std::make_unique<Cifar10>(std::vector<std::string>{f}) : nullptr;
  }();
  return ds.get();
}

const ImageFolder* cats_dogs(bool cached) {
  auto make = [](bool c) -> std::unique_ptr<ImageFolder> {
    const std::string root = data_dir() + "/cats_dogs/train";
    if (!std::filesystem::is_directory(root)) return nullptr;
    ImageFolderOptions o;
    o.image_size = 64;
    if (c) {
      o.resize_short_side = 73;  // what the eval pipeline resizes to before its 64 crop
      o.cache = true;
    }
    return std::make_unique<ImageFolder>(root, o);
  };
  static std::unique_ptr<ImageFolder> plain = make(false), with_cache = make(true);
  return cached ? with_cache.get() : plain.get();
}

// One worker's rate: batches made on this thread, consecutive indices wrapping round the set.
void run_single(benchmark::State& state, const ImageDataset* ds, const Pipeline& p, int64_t batch, bool channels_last) {
  if (!ds) {
    state.SkipWithError("shared data not found (set DUET_DATA_DIR)");
    return;
  }
  std::vector<int64_t> idx(static_cast<size_t>(batch));
  int64_t next = 0, epoch = 0;
  for (auto _ : state) {
    for (int64_t& i : idx) {
      i = next;
      if (++next == ds->size()) next = 0, ++epoch;
    }
    Batch b = make_batch(*ds, idx, p, 1, epoch, channels_last);
    benchmark::DoNotOptimize(b.images.raw_data());
  }
  state.SetItemsProcessed(state.iterations() * batch);
}

void BM_Cifar10_TrainAugment_OneWorker(benchmark::State& state) {
  run_single(state, cifar(), cifar10_train_pipeline(), 256, state.range(0) != 0);
}
BENCHMARK(BM_Cifar10_TrainAugment_OneWorker)->ArgName("channels_last")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_CatsDogs_DecodeAugment64_OneWorker(benchmark::State& state) {
  run_single(state, cats_dogs(false), imagenet_train_pipeline(64), 32, false);
}
BENCHMARK(BM_CatsDogs_DecodeAugment64_OneWorker)->Unit(benchmark::kMillisecond);

void BM_CatsDogs_DecodeEval64_OneWorker(benchmark::State& state) {
  run_single(state, cats_dogs(false), imagenet_eval_pipeline(64), 32, false);
}
BENCHMARK(BM_CatsDogs_DecodeEval64_OneWorker)->Unit(benchmark::kMillisecond);

// After the first pass every image comes from the u8 cache (73 px shorter side): augment only.
void BM_CatsDogs_CachedAugment64_OneWorker(benchmark::State& state) {
  const ImageFolder* ds = cats_dogs(true);
  if (ds)
    for (int64_t i = 0; i < ds->size(); ++i) ds->load(i);
  run_single(state, ds, imagenet_train_pipeline(64), 32, false);
}
BENCHMARK(BM_CatsDogs_CachedAugment64_OneWorker)->Unit(benchmark::kMillisecond);

// The whole loader: N workers, one consumer taking batches as fast as they come.
void run_loader(benchmark::State& state, const ImageDataset* ds, const Pipeline& p, int64_t batch) {
  if (!ds) {
    state.SkipWithError("shared data not found (set DUET_DATA_DIR)");
    return;
  }
  LoaderOptions o;
  o.batch_size = batch;
  o.num_workers = static_cast<int>(state.range(0));
  o.seed = 1;
  DataLoader loader(*ds, o, p);
  int64_t images = 0, epoch = 0;
  loader.start_epoch(epoch);
  for (auto _ : state) {
    Batch b;
    if (!loader.next(b)) {
      loader.start_epoch(++epoch);
      loader.next(b);
    }
    images += b.images.size(0);
  }
  state.SetItemsProcessed(images);
}

void BM_Loader_Cifar10_Train(benchmark::State& state) { run_loader(state, cifar(), cifar10_train_pipeline(), 128); }
BENCHMARK(BM_Loader_Cifar10_Train)->ArgName("workers")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Loader_CatsDogs_Train64(benchmark::State& state) {
  run_loader(state, cats_dogs(false), imagenet_train_pipeline(64), 32);
}
BENCHMARK(BM_Loader_CatsDogs_Train64)->ArgName("workers")->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace duet::datasets

BENCHMARK_MAIN();
