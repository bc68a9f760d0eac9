// `duet models`: counts come from models/registry.h's model_stats (one batch-1 forward each).
#include "cli/commands.h"
#include "cli/global_options.h"
#include <iostream>
#include <memory>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "models/registry.h"

namespace duet::app {

namespace {
struct ModelsCmd {
  std::string filter;
  int64_t image_size = 0;
  bool names_only = false;
};

int run_models(const ModelsCmd& m, const GlobalOptions& g, std::ostream& out) {
  apply_global_options(g);
  std::vector<models::ModelInfo> shown;
  for (const models::ModelInfo& i : models::list_models())
    if (m.filter.empty() || i.name.find(m.filter) != std::string::npos || i.family == m.filter) shown.push_back(i);
  DUET_CHECK(!shown.empty(), "no model name contains '{}'; run `duet models` for the list", m.filter);
  if (m.names_only) {
    for (const auto& i : shown) out << fmt::format("{:<20} {:<10} {}\n", i.name, i.family, i.description);
    return 0;
  }
  out << fmt::format("{:<20} {:<10} {:>12} {:>8} {:>6}  {}\n", "name", "family", "parameters", "GFLOPs", "size",
                     "description");
  for (const auto& i : shown) {
    models::ModelOptions o;
    o.image_size = m.image_size;
    o.init = false;  // counting needs shapes, not values
    const models::ModelStats s = models::model_stats(i.name, o);
    out << fmt::format("{:<20} {:<10} {:>12} {:>8.3f} {:>6}  {}\n", i.name, i.family, s.parameters, s.forward_flops * 1e-9,
                       s.image_size, i.description)
        << std::flush;
  }
  out << "GFLOPs: forward, per image, at the size shown (a multiply-add counts 2); vit_{tiny,small,base}_p<N> takes any "
         "patch size\n";
  return 0;
}
}  // namespace

Command add_models_command(CLI::App& app, GlobalOptions& g) {
  auto m = std::make_shared<ModelsCmd>();
  CLI::App* cmd = app.add_subcommand("models", "List the model zoo: name, parameters, forward GFLOPs per image");
  cmd->add_option("filter", m->filter, "Only names containing this text, or a family (resnet, vit, ...)");
  cmd->add_option("--image-size", m->image_size, "Count FLOPs at this input size (default: each model's own)")
      ->check(CLI::Range(int64_t{8}, int64_t{1024}));
  cmd->add_flag("--names", m->names_only, "Names and descriptions only (no counting: instant)");
  add_global_options(*cmd, g);
  cmd->footer("Examples:\n  duet models resnet\n  duet models --names\n  duet models vit_tiny_p4 --image-size 32");
  return {cmd, [m, &g](std::ostream& out) { return run_models(*m, g, out); }};
}

}  // namespace duet::app
