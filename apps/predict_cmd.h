// `duet predict IMAGE... --checkpoint FILE`: the top-k classes of each image with probabilities.
#pragma once
#include "apps/command.h"
#include "apps/run_env.h"

namespace duet::app {

Command add_predict_command(CLI::App& app, GlobalOptions& g);

}  // namespace duet::app
