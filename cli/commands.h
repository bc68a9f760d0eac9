// The sub-commands of `duet`, one file each (cli/<name>.cpp). Each adds itself to the CLI11 app,
// binding its options to state it owns, and returns what runs once the command line has been
// parsed into it (cli/cli.cpp calls the one that was chosen).
#pragma once
#include <functional>
#include <iosfwd>
#include <string>

namespace CLI {
class App;
}

namespace duet::app {

struct GlobalOptions;  // train/run_env.h

struct Command {
  CLI::App* app = nullptr;
  std::function<int(std::ostream&)> run;  // returns the process's exit status
};

// Each takes the global options (--device, --backend, --threads, --seed), which it also accepts
// after its own name.
Command add_train_command(CLI::App& app, GlobalOptions& g);     // cli/train.cpp
Command add_eval_command(CLI::App& app, GlobalOptions& g);      // cli/eval.cpp
Command add_predict_command(CLI::App& app, GlobalOptions& g);   // cli/predict.cpp
Command add_models_command(CLI::App& app, GlobalOptions& g);    // cli/models.cpp
Command add_data_command(CLI::App& app, GlobalOptions& g);      // cli/data.cpp
Command add_selftest_command(CLI::App& app, GlobalOptions& g);  // cli/selftest.cpp
Command add_profile_command(CLI::App& app, GlobalOptions& g);   // cli/profile.cpp
// probe: --device / --backend pick what is probed and --threads the largest thread count measured.
Command add_probe_command(CLI::App& app, GlobalOptions& g);     // cli/probe.cpp
// The profiler's readers take no global options: they compute nothing.
Command add_report_command(CLI::App& app);   // cli/report.cpp
Command add_compare_command(CLI::App& app);  // cli/compare.cpp
// export writes files from a checkpoint or a fresh model: nothing to compute on a device either.
Command add_export_command(CLI::App& app);   // cli/export.cpp

// The report `duet data PATH` prints; duet::Error when the path is not a dataset duet can read.
std::string describe_dataset(const std::string& path);

}  // namespace duet::app
