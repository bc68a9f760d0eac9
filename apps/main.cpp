// The `duet` command line. Sub-commands live in their own files (apps/*_cmd.cpp).
#include <cstdio>
#include <exception>
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include "apps/train_cmd.h"
#include "engine/error.h"

int main(int argc, char** argv) {
  CLI::App app{"duet: a from-scratch training engine for CNNs and ViTs"};
  app.require_subcommand(1);
  duet::app::TrainOptions train;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a model and report loss, accuracy and throughput");
  duet::app::add_train_options(*train_cmd, train);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (train_cmd->parsed()) duet::app::run_train(train);
  } catch (const duet::Error& e) {
    fmt::print(stderr, "duet: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "duet: internal error: {}\n", e.what());
    return 2;
  }
  return 0;
}
