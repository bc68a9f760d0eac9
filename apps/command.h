// A sub-command of `duet` as main() sees it: the CLI11 sub-app (its options bound to state the
// command owns) and what runs once the command line has been parsed into it.
#pragma once
#include <functional>
#include <iosfwd>

namespace CLI {
class App;
}

namespace duet::app {

struct Command {
  CLI::App* app = nullptr;
  std::function<int(std::ostream&)> run;  // returns the process's exit status
};

}  // namespace duet::app
