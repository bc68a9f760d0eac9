// Output-path probes and JSON that tolerates non-UTF-8 names.
#include "train/output_check.h"
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fcntl.h>
#include <unistd.h>
#include <fmt/format.h>
#include "engine/error.h"

namespace duet::app {

namespace fs = std::filesystem;

void check_output_file(const std::string& option, const std::string& path, OutputKind kind) {
  if (path.empty()) return;
  const fs::path target(path);
  const bool folder = kind == OutputKind::folder;
  fs::path dir = folder ? target : target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::error_code ec;
  DUET_CHECK(!folder || !fs::exists(target, ec) || fs::is_directory(target, ec),
             "{} '{}' is a file; expected a folder (it is created when missing)", option, path);
  // The writer creates missing folders: then the nearest existing one must take a new entry.
  // A relative path's first folder is made in the working folder.
  if (kind == OutputKind::creates_folders || folder)
    while (!fs::exists(dir, ec) && dir != ".")
      dir = dir.has_parent_path() && dir.parent_path() != dir ? dir.parent_path() : fs::path(".");
  DUET_CHECK(fs::exists(dir, ec), "{} '{}': the folder '{}' does not exist; create it first (mkdir -p '{}')", option,
             path, dir.string(), dir.string());
  DUET_CHECK(fs::is_directory(dir, ec), "{} '{}': '{}' is not a folder; expected the file's folder", option, path,
             dir.string());
  DUET_CHECK(folder || !fs::is_directory(target, ec), "{} '{}' is a folder; expected a file name (such as '{}/run.out')",
             option, path, path);
  // access() alone says yes to root on a read-only mount and no to some ACLs: create a real file.
  std::string probe = (dir / ".duet-write-probe-XXXXXX").string();
  const int fd = ::mkstemp(probe.data());
  DUET_CHECK(fd >= 0, "{} '{}': cannot create a file in the folder '{}': {}", option, path, dir.string(),
             std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  if (kind == OutputKind::appends && fs::exists(target, ec))
    DUET_CHECK(::access(path.c_str(), W_OK) == 0, "{} '{}': the file exists and cannot be written: {}", option, path,
               std::strerror(errno));
}

namespace {
bool valid_utf8(const std::string& s) {
  try {
    (void)nlohmann::json(s).dump();
    return true;
  } catch (const nlohmann::json::type_error&) {
    return false;
  }
}

std::string find_invalid(const nlohmann::json& j, const std::string& where) {
  if (j.is_string()) return valid_utf8(j.get_ref<const std::string&>()) ? "" : (where.empty() ? "(value)" : where);
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      const std::string key = where.empty() ? k : where + "." + k;
      if (!valid_utf8(k)) return key;
      std::string bad = find_invalid(v, key);
      if (!bad.empty()) return bad;
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      std::string bad = find_invalid(j[i], fmt::format("{}[{}]", where, i));
      if (!bad.empty()) return bad;
    }
  }
  return "";
}
}  // namespace

std::string first_invalid_utf8(const nlohmann::json& j) { return find_invalid(j, ""); }

std::string dump_lenient(const nlohmann::json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace duet::app
