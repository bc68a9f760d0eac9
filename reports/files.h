// Files the profiler reads and writes. Reports are written atomically (engine/atomic_file.h), so a
// crash or a full disk never leaves a half-written report behind.
#pragma once
#include <string>
#include <string_view>

namespace duet::profiler {

// Writes `content` to `path` atomically; creates missing parent folders.
// Throws duet::Error naming the path and the reason.
void write_file_atomic(const std::string& path, std::string_view content);
// The whole file; throws duet::Error "<what> '<path>' ..." when it is missing or unreadable.
std::string read_file(const std::string& path, const char* what);
// The current time as ISO 8601 UTC ("2026-11-22T06:13:18Z"): the "created" stamp of reports and probes.
std::string utc_now();

}  // namespace duet::profiler
