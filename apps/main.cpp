// The `duet` executable: the command line lives in apps/cli.cpp, each sub-command in its own
// apps/*_cmd.cpp.
#include <iostream>
#include "apps/cli.h"

int main(int argc, char** argv) { return duet::app::run_cli(argc, argv, std::cout, std::cerr); }
