// `duet models`: the zoo, one model a line with its parameter count and forward GFLOPs per image.
#pragma once
#include "apps/command.h"
#include "apps/run_env.h"

namespace duet::app {

Command add_models_command(CLI::App& app, GlobalOptions& g);

}  // namespace duet::app
