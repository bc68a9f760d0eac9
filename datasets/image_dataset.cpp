#include "datasets/image_dataset.h"
#include "engine/allocator.h"

namespace duet::datasets {

Batch ImageDataset::batch(const std::vector<int64_t>& indices) const {
  return make_batch(*this, indices, eval_pipeline(), 0, 0, false);
}

Batch make_batch(const ImageDataset& ds, const std::vector<int64_t>& indices, const Pipeline& pipeline, uint64_t seed,
                 int64_t epoch, bool channels_last, const std::atomic<bool>* cancel) {
  MemTagGuard tag(MemTag::data);
  const auto b = static_cast<int64_t>(indices.size());
  DUET_CHECK(b >= 1, "make_batch: no indices given");
  Batch out;
  std::vector<int64_t> labels(static_cast<size_t>(b));
  int64_t h = 0, w = 0, c = 0, first = 0;
  float* dst = nullptr;
  for (int64_t k = 0; k < b; ++k) {
    if (cancel && cancel->load(std::memory_order_relaxed)) return {};
    const int64_t index = indices[static_cast<size_t>(k)];
    DUET_CHECK(index >= 0 && index < ds.size(), "make_batch: index {} is out of range for a dataset of {} samples",
               index, ds.size());
    Sample s = ds.load(index);
    SampleRng rng(seed, epoch, index);
    Image img = pipeline.run(std::move(s.image), rng);
    if (k == 0) {
      // The batch's size is the first sample's; the pipeline must bring every sample to it.
      h = img.h, w = img.w, c = img.c, first = index;
      out.images = Tensor::empty({b, c, h, w}, TensorOptions(), channels_last ? MemoryFormat::channels_last : MemoryFormat::contiguous);
      dst = out.images.data<float>();
    }
    DUET_CHECK(img.h == h && img.w == w && img.c == c,
               "make_batch: sample {} came out of the pipeline as {}x{}x{} (HxWxC) but sample {} as {}x{}x{}; end the "
               "pipeline with a fixed-size step (center_crop, random_resized_crop, resize_to) [{}]",
               index, img.h, img.w, img.c, first, h, w, c, pipeline.describe());
    write_normalized(img, pipeline.norm, channels_last, dst + k * h * w * c);
    labels[static_cast<size_t>(k)] = s.label;
  }
  out.labels = Tensor::from_vector(labels, {b});
  return out;
}

}  // namespace duet::datasets
