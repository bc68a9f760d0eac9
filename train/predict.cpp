// Top-k and the image-file batch of `duet predict`.
#include "train/predict.h"
#include <algorithm>
#include <cmath>
#include <numeric>
#include <fmt/format.h>
#include "datasets/image_file.h"
#include "engine/error.h"

namespace duet::app {

std::vector<Prediction> top_k(const std::vector<float>& logits, int64_t k, const std::vector<std::string>& names) {
  DUET_CHECK(!logits.empty(), "top_k: no logits");
  DUET_CHECK(k >= 1, "top_k: k = {}: expected 1 or more", k);
  // Softmax in double, shifted by the maximum so exp never overflows.
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(static_cast<double>(logits[i]) - mx);
  std::vector<size_t> order(logits.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  order.resize(std::min(order.size(), static_cast<size_t>(k)));
  std::vector<Prediction> out;
  for (size_t i : order)
    out.push_back({static_cast<int64_t>(i), i < names.size() ? names[i] : fmt::format("class{}", i), p[i] / z});
  return out;
}

Tensor load_image_batch(const std::vector<std::string>& paths, const datasets::Pipeline& pipeline, MemoryFormat f) {
  DUET_CHECK(!paths.empty(), "predict: no image files given");
  Tensor out;
  float* dst = nullptr;
  int64_t h = 0, w = 0, c = 0;
  for (size_t k = 0; k < paths.size(); ++k) {
    datasets::SampleRng rng(0, 0, static_cast<int64_t>(k));  // eval steps draw nothing
    const datasets::Image img = pipeline.run(datasets::decode_image_file(paths[k]), rng);
    if (k == 0) {
      h = img.h, w = img.w, c = img.c;
      out = Tensor::empty({static_cast<int64_t>(paths.size()), c, h, w}, TensorOptions(), f);
      dst = out.data<float>();
    }
    DUET_CHECK(img.h == h && img.w == w && img.c == c, "predict: '{}' came out of the transform as {}x{}x{}, not {}x{}x{}",
               paths[k], img.h, img.w, img.c, h, w, c);
    datasets::write_normalized(img, pipeline.norm, f == MemoryFormat::channels_last, dst + static_cast<int64_t>(k) * h * w * c);
  }
  return out;
}

}  // namespace duet::app
