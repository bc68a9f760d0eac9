// Output files are checked when a command starts, before any work: a typo in --checkpoint must not
// cost an epoch of training before the first write fails.
#pragma once
#include <string>

namespace duet::app {

// Throws duet::Error naming `option` and `path` unless the folder `path` would be written in exists,
// is a folder, and accepts a new file (a probe file is created there and removed), and `path`
// itself is not a folder. An empty path (option not given) passes.
void check_output_path(const std::string& option, const std::string& path);

}  // namespace duet::app
