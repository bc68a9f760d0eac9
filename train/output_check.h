// Start-up checks of everything a run will write, so that a typo in an output path or a
// configuration that cannot be stored fails in the first second instead of after an epoch.
#pragma once
#include <string>
#include <nlohmann/json.hpp>

namespace duet::app {

enum class OutputKind {
  replaces,         // written whole (atomically) into an existing folder: checkpoints
  appends,          // an existing file is continued: the log of a resumed run
  creates_folders,  // the writer creates missing folders (profile reports and traces)
  folder,           // `path` is a folder the writer creates when missing and fills (TensorBoard's)
};

// duet::Error naming `option` and `path` unless the file can be created: its folder exists (or,
// for creates_folders, the nearest existing ancestor does), is a folder, and a probe file can be
// created and removed there; the path itself is not a folder (for `folder`: is not a file); an
// appended file must be writable.
void check_output_file(const std::string& option, const std::string& path, OutputKind kind = OutputKind::replaces);

// The dotted key of the first string (key or value) in `j` that is not valid UTF-8, or "" when
// all are. nlohmann's strict dump() throws an "internal"-looking type_error on such strings.
std::string first_invalid_utf8(const nlohmann::json& j);

// j.dump() that never throws on strings that are not UTF-8 (file and class-folder names on
// Linux are bytes): bad bytes become U+FFFD. What checkpoints, logs and reports store.
std::string dump_lenient(const nlohmann::json& j, int indent = -1);

}  // namespace duet::app
