// `duet predict`: images through the checkpoint's eval transform, in batches of 64.
#include "apps/predict_cmd.h"
#include <algorithm>
#include <memory>
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "apps/evaluate.h"
#include "apps/model_file.h"
#include "apps/predict.h"
#include "apps/train_data.h"
#include "engine/autograd.h"

namespace duet::app {

namespace {
struct PredictCmd {
  std::vector<std::string> images;
  std::string checkpoint;
  int64_t top = 5;
};

int run_predict(const PredictCmd& p, const GlobalOptions& g, std::ostream& out) {
  const RunEnv env = apply_global_options(g);
  TrainedModel t = load_trained_model(p.checkpoint);
  const datasets::Pipeline pipeline = pipeline_from_json(t.raw_config.value("eval_transform", nlohmann::json()));
  const MemoryFormat f = input_memory_format(t.config.data.memory_format, env);
  t.model->to(env.device);
  NoGradGuard no_grad;
  const int64_t k = std::min<int64_t>(p.top, t.config.model.classes);
  const size_t chunk = 64;
  for (size_t i = 0; i < p.images.size(); i += chunk) {
    const std::vector<std::string> paths(p.images.begin() + static_cast<std::ptrdiff_t>(i),
                                         p.images.begin() + static_cast<std::ptrdiff_t>(std::min(i + chunk, p.images.size())));
    const Tensor logits = (*t.model)(prepare_input(load_image_batch(paths, pipeline, f), env.device, f));
    const std::vector<float> all = logits.to(Device::cpu()).contiguous().to_vector<float>();
    const auto classes = static_cast<size_t>(t.config.model.classes);
    for (size_t r = 0; r < paths.size(); ++r) {
      const std::vector<float> row(all.begin() + static_cast<std::ptrdiff_t>(r * classes),
                                   all.begin() + static_cast<std::ptrdiff_t>((r + 1) * classes));
      out << paths[r] << "\n";
      for (const Prediction& pr : top_k(row, k, t.class_names))
        out << fmt::format("  {:>6.2f}%  {}\n", 100.0 * pr.probability, pr.name);
    }
  }
  return 0;
}
}  // namespace

Command add_predict_command(CLI::App& app, GlobalOptions& g) {
  auto p = std::make_shared<PredictCmd>();
  CLI::App* cmd = app.add_subcommand("predict", "Classify image files with a trained checkpoint (top-k with probabilities)");
  cmd->add_option("images", p->images, "JPEG or PNG files")->required()->check(CLI::ExistingFile);
  cmd->add_option("-c,--checkpoint", p->checkpoint, "Checkpoint written by duet train --checkpoint")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("-k,--top", p->top, "Classes to show per image")->capture_default_str()->check(CLI::Range(int64_t{1}, int64_t{1000}));
  add_global_options(*cmd, g);
  cmd->footer("Example:\n  duet predict --checkpoint catdog.safetensors ../shared/data/cats_dogs/test/cat/cat.2001.jpg");
  return {cmd, [p, &g](std::ostream& out) { return run_predict(*p, g, out); }};
}

}  // namespace duet::app
