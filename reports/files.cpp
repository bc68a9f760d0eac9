// The profiler's file helpers (see files.h): atomic writes, reads that name the file, UTC time stamps.
#include "reports/files.h"
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include "engine/atomic_file.h"
#include "engine/error.h"

namespace duet::profiler {

namespace fs = std::filesystem;

void write_file_atomic(const std::string& path, std::string_view content) {
  DUET_CHECK(!path.empty(), "cannot write a profiler file: the path is empty");
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) {
    fs::create_directories(target.parent_path(), ec);
    DUET_CHECK(!ec, "cannot create folder '{}' for '{}': {}", target.parent_path().string(), path, ec.message());
  }
  write_file_atomically(path, "cannot write the file", [&](const FileSink& out) { out.write(content.data(), content.size()); });
}

std::string read_file(const std::string& path, const char* what) {
  std::error_code ec;
  DUET_CHECK(fs::exists(path, ec), "{} '{}' does not exist", what, path);
  DUET_CHECK(!fs::is_directory(path, ec), "{} '{}' is a folder, expected a file", what, path);
  std::ifstream in(path, std::ios::binary);
  DUET_CHECK(in.good(), "{} '{}' cannot be opened: {}", what, path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace duet::profiler
