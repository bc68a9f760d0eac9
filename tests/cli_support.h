// Runs the `duet` command line in-process, for the suites of cli/ (test_cli, test_reliability).
#pragma once
#include <sstream>
#include <string>
#include <vector>
#include "cli/cli.h"
#include "engine/device.h"

namespace duet::testing {

struct CliResult {
  int status = 0;
  std::string out, err;
};

inline CliResult duet_cli(std::vector<std::string> args) {
  args.insert(args.begin(), "duet");
  std::ostringstream out, err;
  // Commands may switch the CPU backend; put it back for the next test.
  BackendGuard keep(DeviceType::cpu, default_backend(DeviceType::cpu));
  CliResult r;
  r.status = app::run_cli(args, out, err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace duet::testing
