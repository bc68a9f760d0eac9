#include "apps/output_check.h"
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include "engine/error.h"

namespace duet::app {

void check_output_path(const std::string& option, const std::string& path) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path p(path);
  std::error_code ec;
  DUET_CHECK(!fs::is_directory(p, ec), "{} '{}' is a folder: expected a file name", option, path);
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  DUET_CHECK(fs::exists(dir, ec), "{} '{}': the folder '{}' does not exist; create it first", option, path, dir.string());
  DUET_CHECK(fs::is_directory(dir, ec), "{} '{}': '{}' is not a folder", option, path, dir.string());
  // The same kind of write the real one makes (a new file beside the target), undone at once.
  std::string probe = (dir / ".duet-write-probe-XXXXXX").string();
  const int fd = mkstemp(probe.data());
  DUET_CHECK(fd >= 0, "{} '{}': cannot create a file in the folder '{}': {}", option, path, dir.string(), std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace duet::app
