// `duet eval CHECKPOINT`: a trained model on a dataset split; accuracy, loss, per-class accuracy.
#pragma once
#include "apps/command.h"
#include "apps/run_env.h"

namespace duet::app {

Command add_eval_command(CLI::App& app, GlobalOptions& g);

}  // namespace duet::app
