// The `duet` executable: the command line lives in cli/cli.cpp, each sub-command in its own
// cli/<name>.cpp.
#include <iostream>
#include "cli/cli.h"

int main(int argc, char** argv) { return duet::app::run_cli(argc, argv, std::cout, std::cerr); }
