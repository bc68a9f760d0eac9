// The whole `duet` command line as a function, so tests can run any command in-process:
// parses argv, runs the chosen sub-command, prints errors as "duet: error: ..." and returns the
// exit status (0 ok, 1 a user error or failed check, 2 an internal error).
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

namespace duet::app {

int run_cli(int argc, const char* const* argv, std::ostream& out, std::ostream& err);
int run_cli(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);  // args[0] is the program

}  // namespace duet::app
