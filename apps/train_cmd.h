// `duet train`: the options of a training run (model, data, optimizer, schedule, checkpoints,
// logging, profiling) on top of apps/trainer.h.
#pragma once
#include "apps/command.h"
#include "apps/run_env.h"

namespace duet::app {

Command add_train_command(CLI::App& app, GlobalOptions& g);

}  // namespace duet::app
