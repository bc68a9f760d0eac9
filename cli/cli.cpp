// The sub-commands (cli/<name>.cpp) wired into one CLI11 app (see cli.h).
#include "cli/cli.h"
#include <cmath>
#include <exception>
#include <ostream>
#include <stdexcept>
#include <string>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "cli/commands.h"
#include "cli/global_options.h"
#include "engine/error.h"

namespace duet::app {

namespace {
const char* kFooter = R"(Start here:
  duet train --model small_cnn --dataset synthetic --profile
      train a small CNN on generated images (no download) and print the per-op profile
  duet models                                   the model zoo with parameters and GFLOPs
  duet data ../shared/data/cifar10              what a dataset folder holds
  duet train --model resnet18_cifar --width-mult 0.5 --dataset cifar10 --data ../shared/data/cifar10 \
      --epochs 15 --batch 128 --lr 0.2 --nesterov --schedule onecycle --label-smoothing 0.1 \
      --checkpoint cifar.safetensors
  duet eval cifar.safetensors                   accuracy, loss and per-class accuracy
  duet predict -c cifar.safetensors photo.jpg   top-5 classes of an image
  duet export --onnx cifar.onnx -c cifar.safetensors   the model as ONNX, for ONNX Runtime
  duet profile --model resnet18_cifar           per-op profile of training steps (no data needed)
  duet profile --model mobilenet_v2 --batch 16,32,64,128   throughput and memory per batch size
  duet probe; duet report run.json; duet compare a.json b.json   the profiler's tools
Each command has its own --help (duet train --help). Global options (--device, --backend,
--threads, --seed) go before or after the command's name. Guide: docs/training.md.)";
}  // namespace

namespace {
// CLI11's Range compares with < and >, which NaN passes: every floating-point option of every
// command must also be a finite number. Applied here, in one place, so a new option gets it too.
std::string finite_or_why(std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::out_of_range&) {
    return "must be a finite number, got " + text + " (out of range)";
  } catch (const std::invalid_argument&) {
    return "";  // not a number at all: the option's own conversion says so
  }
  return std::isfinite(v) ? "" : "must be a finite number, got " + text;
}

void require_finite_floats(CLI::App& app) {
  static const CLI::Validator finite(finite_or_why, "FINITE", "finite");
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) require_finite_floats(*sub);
  for (CLI::Option* opt : app.get_options())
    if (opt->get_type_name().find("FLOAT") != std::string::npos) opt->check(finite);
}
}  // namespace

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err) {
  CLI::App app{"duet: a from-scratch training engine for CNNs and ViTs, with a per-op profiler"};
  app.require_subcommand(1);
  app.footer(kFooter);
  app.set_version_flag("--version", "duet 0.1.0");
  GlobalOptions global;
  add_global_options(app, global);
  const std::vector<Command> commands{add_train_command(app, global),   add_eval_command(app, global),
                                      add_predict_command(app, global), add_models_command(app, global),
                                      add_data_command(app, global),    add_selftest_command(app, global),
                                      add_profile_command(app, global), add_probe_command(app, global),
                                      add_report_command(app),          add_compare_command(app),
                                      add_export_command(app)};
  require_finite_floats(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e, out, err);
  }
  try {
    for (const Command& c : commands)
      if (c.app->parsed()) return c.run(out);
    err << "duet: no command given; see duet --help\n";
    return 1;
  } catch (const Error& e) {
    out.flush();
    err << "duet: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    out.flush();
    err << "duet: internal error: " << e.what() << "\n";
    return 2;
  }
}

int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  return run_cli(static_cast<int>(argv.size()), argv.data(), out, err);
}

}  // namespace duet::app
