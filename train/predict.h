// Inference on image files: the checkpoint's eval transform (resize the shorter side, centre
// crop, normalise) into one batch, and the top-k classes of each row of logits by softmax
// probability.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "datasets/transforms.h"
#include "engine/tensor.h"

namespace duet::app {

struct Prediction {
  int64_t index = 0;
  std::string name;
  double probability = 0;
};

// The k most probable classes of one row of logits, most probable first (ties: lower index
// first). k is clamped to the number of classes; names may be empty (then "class<i>").
std::vector<Prediction> top_k(const std::vector<float>& logits, int64_t k, const std::vector<std::string>& names);

// Decodes each file (duet::Error naming a broken one) and runs the pipeline's steps and
// normalisation: f32 [N, C, H, W] in the given memory format.
Tensor load_image_batch(const std::vector<std::string>& paths, const datasets::Pipeline& pipeline, MemoryFormat f);

}  // namespace duet::app
