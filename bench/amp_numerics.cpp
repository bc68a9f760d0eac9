// duet's side of bench/amp_numerics.py: a zoo model's gradients (or its weights after a few SGD
// steps) in f32 and under an autocast dtype, from weights and batches the script wrote, so the
// script can hold duet's mixed-precision error against PyTorch's autocast on the same weights and
// data. Not a user tool; the script documents the comparison. Threads: OMP_NUM_THREADS.
//
//   duet_amp_numerics --model resnet18_cifar --width-mult 0.5 --classes 10 --image-size 32
//       --weights W.safetensors --batches B.safetensors --amp bf16 --steps 0 --out OUT
//
// B holds x [S*batch, C, H, W] (f32, normalised) and y [S*batch] (i64); step s trains on slice
// s % S. --steps 0 writes OUT.f32.safetensors and OUT.<amp>.safetensors with the gradients of the
// first batch's loss; --steps K > 0 writes the state (weights and running statistics) after K
// steps of SGD (Nesterov momentum 0.9, weight decay 5e-4, --lr), starting from W each time.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <optional>
#include "engine/autocast.h"
#include "engine/duet.h"
#include "engine/optim/optimizer.h"
#include "engine/serialize.h"
#include "models/registry.h"

using namespace duet;

namespace {

Tensor named(const NamedTensors& v, const std::string& name, const std::string& file) {
  for (const auto& [k, t] : v)
    if (k == name) return t;
  throw Error(fmt::format("{} has no tensor '{}'", file, name));
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"duet's mixed-precision gradients or trajectories for bench/amp_numerics.py"};
  std::string model = "resnet18_cifar", weights, batches, amp = "bf16", out;
  double width = 1.0, lr = 0.05, label_smoothing = 0.1;
  int64_t classes = 10, image_size = 32, batch = 128, steps = 0;
  app.add_option("--model", model);
  app.add_option("--width-mult", width);
  app.add_option("--classes", classes);
  app.add_option("--image-size", image_size);
  app.add_option("--weights", weights)->required();
  app.add_option("--batches", batches)->required();
  app.add_option("--batch", batch);
  app.add_option("--amp", amp)->check(CLI::IsMember({"bf16", "fp16"}));
  app.add_option("--steps", steps)->check(CLI::NonNegativeNumber);
  app.add_option("--lr", lr);
  app.add_option("--label-smoothing", label_smoothing);
  app.add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);

  models::ModelOptions o;
  o.num_classes = classes;
  o.image_size = image_size;
  o.width_mult = width;
  const NamedTensors w = load_safetensors(weights);
  const NamedTensors b = load_safetensors(batches);
  const Tensor X = named(b, "x", batches), Y = named(b, "y", batches);
  const int64_t slices = X.size(0) / batch;
  DUET_CHECK(slices >= 1, "{} holds {} images, fewer than one batch of {}", batches, X.size(0), batch);

  for (const std::string& mode : {std::string("f32"), amp}) {
    auto m = models::create_model(model, o);
    const LoadReport r = load_state_dict(*m, w, /*strict=*/false);
    for (const std::string& k : r.missing)
      DUET_CHECK(k.ends_with("num_batches_tracked"), "{} has no tensor '{}' of model {}", weights, k, model);
    m->train(true);
    optim::SGD opt(m->parameters(), optim::SgdOptions{.lr = lr, .momentum = 0.9, .weight_decay = 5e-4, .nesterov = true});
    double loss_value = 0;
    for (int64_t s = 0; s < std::max<int64_t>(steps, 1); ++s) {
      const int64_t i = s % slices;
      const Tensor x = X.slice(0, i * batch, (i + 1) * batch).contiguous(MemoryFormat::channels_last);
      const Tensor y = Y.slice(0, i * batch, (i + 1) * batch).contiguous();
      opt.zero_grad();
      Tensor loss;
      {
        std::optional<AutocastGuard> scope;
        if (mode != "f32") scope.emplace(mode == "bf16" ? DType::bf16 : DType::f16);
        loss = cross_entropy((*m)(x), y, label_smoothing);
      }
      loss.backward();
      loss_value = loss.item();
      if (steps > 0) opt.step();
    }
    NamedTensors result;
    if (steps == 0) {
      for (const auto& [k, p] : m->named_parameters()) result.emplace_back(k, p.grad().to(DType::f32).contiguous());
    } else {
      for (const auto& [k, t] : state_dict(*m))
        if (t.dtype() != DType::i64) result.emplace_back(k, t.to(DType::f32).contiguous());
    }
    save_safetensors(out + "." + mode + ".safetensors", result);
    std::printf("%s: last loss %.6f\n", mode.c_str(), loss_value);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "duet_amp_numerics: %s\n", e.what());
  return 1;
}
