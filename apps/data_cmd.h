// `duet data PATH`: what a dataset folder holds (format, splits, images per class, broken files);
// `duet data fetch cifar10`: downloads and unpacks CIFAR-10.
#pragma once
#include <string>
#include "apps/command.h"
#include "apps/run_env.h"

namespace duet::app {

Command add_data_command(CLI::App& app, GlobalOptions& g);

// The report `duet data PATH` prints; duet::Error when the path is not a dataset duet can read.
std::string describe_dataset(const std::string& path);

}  // namespace duet::app
