// `duet train` end to end as a function (cli/train.cpp calls it with the parsed options): data,
// model (and --init-from), the trainer and the profile report, on every rank under mpirun.
#pragma once
#include <iosfwd>
#include "train/run_env.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace duet::app {

TrainResult run_training(const TrainConfig& c, const GlobalOptions& g, std::ostream& out);

}  // namespace duet::app
