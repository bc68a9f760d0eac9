// DataLoader: shuffled, sharded batches of any Dataset, made by worker threads into a bounded
// queue ahead of the training loop. Batches come out in a fixed order whatever the number of
// workers: batch k of epoch e depends only on (seed, e, k).
//
//   DataLoader loader(dataset, opts, dataset.train_pipeline());
//   for (int64_t e = 0; e < epochs; ++e) {
//     loader.start_epoch(e);
//     Batch b;
//     while (loader.next(b)) train_step(b);
//   }
//
// Workers run pure host code (file reads, the JPEG/PNG decoders, the u8 transforms, the f32 write); they call
// no engine op, so they never start OpenMP teams beside the training thread's on a small machine.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>
#include "datasets/dataset.h"
#include "datasets/image_dataset.h"

namespace duet::datasets {

struct LoaderOptions {
  int64_t batch_size = 128;
  bool shuffle = true;
  uint64_t seed = 0;  // the epoch's permutation and every sample's augmentation derive from it
  bool drop_last = false;
  int num_workers = 2;       // 0: batches are made on the calling thread inside next()
  int prefetch_batches = 4;  // at most this many batches are made ahead of the consumer
  // channels_last: images are [N, C, H, W] with NHWC memory, what the oneDNN CPU backend runs
  // fastest on.
  MemoryFormat memory_format = MemoryFormat::contiguous;
  // Data-parallel sharding: every rank computes the same permutation and takes batches rank,
  // rank + world_size, ... With drop_last every rank gets the same number of batches (what
  // collective ops need); without it the first ranks may get one more.
  int rank = 0;
  int world_size = 1;
};

class DataLoader {
public:
  // For an ImageDataset each sample is loaded and run through `pipeline` (the dataset's
  // eval_pipeline() when none is given). Other datasets (synthetic) are batched by
  // Dataset::batch and take no pipeline. The dataset must outlive the loader.
  DataLoader(const Dataset& dataset, LoaderOptions options, std::optional<Pipeline> pipeline = std::nullopt);
  ~DataLoader();  // stops and joins the workers, mid-epoch too
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Starts making the batches of `epoch` (ending an unfinished epoch first), from batch
  // `first_batch` on: a run resumed mid-epoch gets the same batches the uninterrupted one did.
  void start_epoch(int64_t epoch, int64_t first_batch = 0);
  // The next batch of the epoch, false when the epoch is done. A worker's error (a bad file) is
  // rethrown here as duet::Error, naming the batch and the original problem. The wait is recorded
  // as profiler event "data.wait" in Phase::data.
  bool next(Batch& out);

  int64_t batches_per_epoch() const;  // for this rank
  int64_t samples_per_epoch() const;  // for this rank
  // This rank's batches of an epoch as dataset indices (what next() will deliver).
  std::vector<std::vector<int64_t>> epoch_batches(int64_t epoch) const;
  // Those of the epoch start_epoch() began (made once, there).
  const std::vector<std::vector<int64_t>>& current_batches() const { return batches_; }
  const LoaderOptions& options() const { return opt_; }
  const Dataset& dataset() const { return ds_; }

private:
  struct Slot {
    bool done = false;
    Batch batch;
    std::exception_ptr error;
  };
  Batch make(int64_t k);
  void worker_loop();
  void stop_workers();

  const Dataset& ds_;
  const ImageDataset* image_ds_ = nullptr;
  LoaderOptions opt_;
  Pipeline pipeline_;

  // Epoch state; everything below is guarded by mu_ except `cancel_` (read between samples).
  int64_t epoch_ = -1;
  std::vector<std::vector<int64_t>> batches_;
  std::vector<Slot> slots_;
  int64_t next_to_make_ = 0, next_to_consume_ = 0;
  bool failed_ = false;  // a worker failed: make no more batches
  std::atomic<bool> cancel_{false};
  std::mutex mu_;
  std::condition_variable cv_work_, cv_ready_;
  std::vector<std::thread> workers_;
};

}  // namespace duet::datasets
