// `duet selftest --device cuda`: every op on the GPU against the reference loops.
#pragma once
#include "apps/command.h"
#include "apps/run_env.h"

namespace duet::app {

Command add_selftest_command(CLI::App& app, GlobalOptions& g);

}  // namespace duet::app
