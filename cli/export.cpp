// `duet export --onnx FILE`: a trained checkpoint (rebuilt as train/model_file.h does) or a fresh
// zoo model written as ONNX by export/onnx_export.h, with its classes, input size and
// normalisation in the file's metadata.
#include "cli/commands.h"
#include <memory>
#include <ostream>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/option_checks.h"
#include "export/onnx_export.h"
#include "models/registry.h"
#include "train/model_file.h"
#include "train/model_setup.h"
#include "train/output_check.h"

namespace duet::app {

namespace {
struct ExportCmd {
  std::string onnx, checkpoint, model;
  int64_t classes = 0, image_size = 0;
  double width_mult = 1.0;
};

const char* kExportFooter = R"(Examples:
  duet export --onnx catdog.onnx -c catdog.safetensors      a trained model, with its classes and normalisation
  duet export --onnx resnet18.onnx --model resnet18         a fresh model (random weights) of the zoo
  duet export --onnx r.onnx --model resnet18_cifar --classes 100 --width-mult 0.5
The graph is ONNX opset 17 with a dynamic batch dimension ("batch"), eval-mode batch norm as
BatchNormalization, and the metadata (class_names, input_size, mean, std, duet_version) that ONNX
Runtime reads with session.get_modelmeta().custom_metadata_map. See docs/models.md.)";

struct Exportable {
  std::shared_ptr<nn::Module> model;
  exporter::OnnxExportInfo info;
  std::string from;  // for the summary line
};

Exportable from_checkpoint(const ExportCmd& e, const CLI::App& cmd) {
  for (const char* opt : {"--classes", "--width-mult", "--image-size"})
    DUET_CHECK(cmd.count(opt) == 0, "{} does not apply with --checkpoint: the checkpoint '{}' records its model's "
               "configuration",
               opt, e.checkpoint);
  TrainedModel t = load_trained_model(e.checkpoint);
  DUET_CHECK(e.model.empty() || e.model == t.config.model.name,
             "--model {}: the checkpoint '{}' holds a {} model (of {} classes), not a {}; leave out --model to export "
             "it",
             e.model, e.checkpoint, t.config.model.name, t.config.model.classes, e.model);
  Exportable x;
  x.model = t.model;
  exporter::OnnxExportInfo& i = x.info;
  i.model_name = t.config.model.name;
  i.image_size = t.image_size;
  i.class_names = t.class_names;
  i.source = e.checkpoint;
  i.epoch = t.epoch;
  const nlohmann::json tr = t.raw_config.value("eval_transform", nlohmann::json());
  if (tr.is_object() && tr.contains("mean")) {
    i.mean = tr.at("mean").get<std::vector<float>>();
    i.std = tr.at("std").get<std::vector<float>>();
    i.resize_shorter = tr.value("resize_shorter", int64_t{0});
  }
  x.from = fmt::format("'{}' (epoch {})", e.checkpoint, t.epoch);
  return x;
}

Exportable fresh(const ExportCmd& e) {
  const models::ModelInfo mi = models::model_info(e.model);
  ModelConfig m;
  m.name = e.model;
  m.width_mult = e.width_mult;
  Exportable x;
  x.info.model_name = e.model;
  x.info.image_size = e.image_size > 0 ? e.image_size : mi.default_image_size;
  x.info.source = "fresh (randomly initialised weights)";
  x.model = build_model(m, e.classes > 0 ? e.classes : mi.default_num_classes, x.info.image_size);
  x.from = "fresh weights";
  return x;
}

int run_export(const ExportCmd& e, const CLI::App& cmd, std::ostream& out) {
  DUET_CHECK(!e.checkpoint.empty() || !e.model.empty(),
             "export: expected --checkpoint FILE (a model trained by duet train) or --model NAME (a fresh zoo model)");
  check_output_file("--onnx", e.onnx);
  Exportable x = e.checkpoint.empty() ? fresh(e) : from_checkpoint(e, cmd);
  const exporter::OnnxExportResult r = exporter::export_onnx(*x.model, x.info, e.onnx);
  out << fmt::format("exported {} from {} to '{}'{}\n", x.info.model_name, x.from, e.onnx,
                     r.external_data ? fmt::format(" (weights in '{}')", r.data_path) : "");
  out << fmt::format("  ONNX opset {}: input [batch, {}, {}, {}] -> logits [batch, {}]; {} nodes, {} initializers, "
                     "{:.1f} MB of weights; checked by onnx::checker\n",
                     exporter::kOnnxOpset, x.info.in_channels, x.info.image_size, x.info.image_size, r.output_shape.at(1),
                     r.nodes, r.initializers, static_cast<double>(r.weight_bytes) / 1e6);
  out << fmt::format("  ops: {}\n", r.op_counts);
  return 0;
}
}  // namespace

Command add_export_command(CLI::App& app) {
  auto e = std::make_shared<ExportCmd>();
  CLI::App* cmd = app.add_subcommand("export", "Write a trained (or fresh) model as ONNX, for ONNX Runtime and others");
  cmd->add_option("--onnx", e->onnx, "The .onnx file to write (atomically; checked by onnx::checker first)")->required();
  cmd->add_option("-c,--checkpoint", e->checkpoint, "Checkpoint written by duet train --checkpoint")
      ->check(CLI::ExistingFile);
  cmd->add_option("--model", e->model, "A zoo model with fresh weights (list them with `duet models`)");
  cmd->add_option("--classes", e->classes, "With --model: output classes (default: the model's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1000000}));
  cmd->add_option("--width-mult", e->width_mult, "With --model: channel multiplier")
      ->capture_default_str()
      ->check(finite_range(0.01, 16.0));
  cmd->add_option("--image-size", e->image_size, "With --model: input height and width (default: the model's)")
      ->check(CLI::Range(int64_t{4}, int64_t{4096}));
  cmd->footer(kExportFooter);
  return {cmd, [e, cmd](std::ostream& out) { return run_export(*e, *cmd, out); }};
}

}  // namespace duet::app
