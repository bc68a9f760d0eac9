#include "datasets/loader.h"
#include <cstring>
#include <numeric>
#include "engine/allocator.h"
#include "engine/profiler/events.h"
#include "engine/rng.h"

namespace duet::datasets {

namespace {

// NCHW f32 -> the same logical tensor with NHWC memory, by a host loop: workers must not
// dispatch engine ops (see loader.h).
Tensor channels_last_on_host(const Tensor& t) {
  DUET_CHECK(t.dim() == 4 && t.dtype() == DType::f32 && t.is_contiguous(),
             "DataLoader: channels_last needs f32 NCHW contiguous images from the dataset, got dtype {} shape {}",
             dtype_name(t.dtype()), shape_str(t.shape()));
  const int64_t n = t.size(0), c = t.size(1), hw = t.size(2) * t.size(3);
  Tensor out = Tensor::empty(t.shape(), TensorOptions(), MemoryFormat::channels_last);
  const float* src = t.data<float>();
  float* dst = out.data<float>();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) dst[(i * hw + p) * c + ch] = src[(i * c + ch) * hw + p];
  return out;
}

uint64_t epoch_shuffle_seed(uint64_t seed, int64_t epoch) {
  return splitmix64(seed ^ splitmix64(static_cast<uint64_t>(epoch) + 0x243f6a8885a308d3ull));
}

}  // namespace

DataLoader::DataLoader(const Dataset& dataset, LoaderOptions options, std::optional<Pipeline> pipeline)
    : ds_(dataset), opt_(options) {
  DUET_CHECK(opt_.batch_size >= 1, "DataLoader: batch_size must be >= 1, got {}", opt_.batch_size);
  DUET_CHECK(opt_.num_workers >= 0, "DataLoader: num_workers must be >= 0, got {}", opt_.num_workers);
  DUET_CHECK(opt_.prefetch_batches >= 1, "DataLoader: prefetch_batches must be >= 1, got {}", opt_.prefetch_batches);
  DUET_CHECK(opt_.world_size >= 1 && opt_.rank >= 0 && opt_.rank < opt_.world_size,
             "DataLoader: rank {} is not in [0, world_size {})", opt_.rank, opt_.world_size);
  DUET_CHECK(ds_.size() > 0, "DataLoader: the dataset is empty");
  image_ds_ = dynamic_cast<const ImageDataset*>(&ds_);
  if (image_ds_) {
    pipeline_ = pipeline ? *pipeline : image_ds_->eval_pipeline();
  } else {
    DUET_CHECK(!pipeline, "DataLoader: a transform pipeline works on u8 images (an ImageDataset); this dataset makes "
                          "its batches itself");
  }
}

DataLoader::~DataLoader() { stop_workers(); }

std::vector<std::vector<int64_t>> DataLoader::epoch_batches(int64_t epoch) const {
  const int64_t n = ds_.size();
  std::vector<int64_t> order;
  if (opt_.shuffle) {
    order = shuffled_indices(n, epoch_shuffle_seed(opt_.seed, epoch));
  } else {
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
  }
  std::vector<std::vector<int64_t>> all = batches_of(order, opt_.batch_size, opt_.drop_last);
  if (opt_.world_size == 1) return all;
  const auto nb = static_cast<int64_t>(all.size());
  const int64_t ws = opt_.world_size;
  const int64_t end = opt_.drop_last ? (nb / ws) * ws : nb;
  std::vector<std::vector<int64_t>> mine;
  for (int64_t b = opt_.rank; b < end; b += ws) mine.push_back(std::move(all[static_cast<size_t>(b)]));
  return mine;
}

// Counted without building the permutation: the batches this rank takes are the b in [0, end)
// with b % world_size == rank, as in epoch_batches.
int64_t DataLoader::batches_per_epoch() const {
  const int64_t n = ds_.size(), bs = opt_.batch_size, ws = opt_.world_size;
  const int64_t all = opt_.drop_last ? n / bs : (n + bs - 1) / bs;
  const int64_t end = opt_.drop_last ? (all / ws) * ws : all;
  return end > opt_.rank ? (end - opt_.rank + ws - 1) / ws : 0;
}

int64_t DataLoader::samples_per_epoch() const {
  const int64_t n = ds_.size(), bs = opt_.batch_size, ws = opt_.world_size;
  const int64_t count = batches_per_epoch();
  int64_t samples = count * bs;
  const int64_t last = (n + bs - 1) / bs - 1;  // the one batch that may be short
  if (!opt_.drop_last && n % bs != 0 && last % ws == opt_.rank) samples -= bs - n % bs;
  return samples;
}

void DataLoader::start_epoch(int64_t epoch, int64_t first_batch) {
  stop_workers();
  epoch_ = epoch;
  batches_ = epoch_batches(epoch);
  const auto nb = static_cast<int64_t>(batches_.size());
  DUET_CHECK(first_batch >= 0 && first_batch <= nb, "DataLoader::start_epoch: first batch {} of an epoch of {} batches",
             first_batch, nb);
  slots_.assign(batches_.size(), Slot{});
  next_to_make_ = next_to_consume_ = first_batch;
  failed_ = false;
  const int64_t n = std::min<int64_t>(opt_.num_workers, nb - first_batch);
  for (int64_t i = 0; i < n; ++i) workers_.emplace_back(&DataLoader::worker_loop, this);
}

Batch DataLoader::make(int64_t k) {
  // Pinned host memory for CUDA goes here: allocate the batch tensors from a pinned allocator
  // so the host-to-device copy can run asynchronously (not yet: batches are plain host memory).
  MemTagGuard tag(MemTag::data);
  const std::vector<int64_t>& indices = batches_[static_cast<size_t>(k)];
  const bool cl = opt_.memory_format == MemoryFormat::channels_last;
  if (image_ds_) return make_batch(*image_ds_, indices, pipeline_, opt_.seed, epoch_, cl, &cancel_);
  Batch b = ds_.batch(indices);
  if (cl && b.images.defined() && b.images.dim() == 4 && !b.images.is_contiguous(MemoryFormat::channels_last))
    b.images = channels_last_on_host(b.images);
  return b;
}

void DataLoader::worker_loop() {
  const auto nb = static_cast<int64_t>(batches_.size());
  while (true) {
    int64_t k;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] {
        return cancel_.load() || failed_ || next_to_make_ >= nb || next_to_make_ < next_to_consume_ + opt_.prefetch_batches;
      });
      if (cancel_.load() || failed_ || next_to_make_ >= nb) return;
      k = next_to_make_++;
    }
    Slot s;
    s.done = true;
    try {
      s.batch = make(k);
    } catch (...) {
      s.error = std::current_exception();
    }
    const bool failed = s.error != nullptr;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (failed) failed_ = true;
      slots_[static_cast<size_t>(k)] = std::move(s);
    }
    cv_ready_.notify_all();
    if (failed) {
      cv_work_.notify_all();
      return;
    }
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    cancel_.store(true);
  }
  cv_work_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  cancel_.store(false);
}

bool DataLoader::next(Batch& out) {
  DUET_CHECK(epoch_ >= 0, "DataLoader::next: call start_epoch(epoch) first");
  const auto nb = static_cast<int64_t>(batches_.size());
  if (next_to_consume_ >= nb) return false;
  const int64_t k = next_to_consume_;
  profiler::PhaseGuard phase(Phase::data);
  profiler::OpScope scope("data.wait", Backend::reference, {}, [] { return OpCost{}; });
  Slot s;
  if (opt_.num_workers == 0) {
    s.done = true;
    try {
      s.batch = make(k);
    } catch (...) {
      s.error = std::current_exception();
    }
    ++next_to_consume_;
  } else {
    std::unique_lock<std::mutex> lk(mu_);
    cv_ready_.wait(lk, [&] { return slots_[static_cast<size_t>(k)].done; });
    s = std::move(slots_[static_cast<size_t>(k)]);
    slots_[static_cast<size_t>(k)] = Slot{};
    ++next_to_consume_;
    lk.unlock();
    cv_work_.notify_all();
  }
  if (s.error) {
    // The epoch ends here: later next() calls return false until start_epoch.
    stop_workers();
    next_to_consume_ = nb;
    try {
      std::rethrow_exception(s.error);
    } catch (const std::exception& e) {
      throw Error(fmt::format("data loader (epoch {}, batch {} of {}): {}", epoch_, k, nb, e.what()));
    }
  }
  out = std::move(s.batch);
  return true;
}

}  // namespace duet::datasets
