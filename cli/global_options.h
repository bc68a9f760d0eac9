// The options every sub-command shares, --device, --backend, --threads and --seed, parsed into
// GlobalOptions (train/run_env.h, which applies them to the process).
#pragma once
#include "train/run_env.h"

namespace CLI {
class App;
}

namespace duet::app {

// Registers the four options on `cmd` (the main app and each sub-command, so they may be given
// before or after the sub-command's name).
void add_global_options(CLI::App& cmd, GlobalOptions& g);

}  // namespace duet::app
