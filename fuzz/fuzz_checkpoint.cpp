// A checkpoint file as --resume reads it: the file, its metadata, then the optimizer state loaded
// into an SGD and an AdamW over two small parameters (what resume does after its checks).
#include "train/checkpoint.h"
#include "engine/optim/optimizer.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = duet::fuzz::input_file(data, size, ".safetensors");
  duet::fuzz::expect_only_duet_errors([&] {
    const duet::app::Checkpoint c = duet::app::read_checkpoint(path);
    const duet::Tensor w = duet::Tensor::zeros({2, 3}).set_requires_grad(true);
    const duet::Tensor b = duet::Tensor::zeros({3}).set_requires_grad(true);
    duet::optim::SGD sgd({w, b}, {.lr = 0.1, .momentum = 0.9});
    duet::fuzz::expect_only_duet_errors([&] { sgd.load_state_tensors(c.optimizer); });
    duet::optim::AdamW adamw({w, b}, {.lr = 0.1});
    adamw.load_state_tensors(c.optimizer);
  });
  return 0;
}
