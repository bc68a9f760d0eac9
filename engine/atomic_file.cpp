#include "engine/atomic_file.h"
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "engine/error.h"

namespace duet {

namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_anonymous{true};

std::string errno_str(int e) { return std::strerror(e); }

// ".<name>.tmp-" and six characters: mkstemp's pattern, and what remove_debris() looks for.
// Appended piece by piece: GCC 12 warns (-Wrestrict, a false positive: its bug 105329) on
// "literal" + a temporary string at -O2.
std::string temp_prefix(const fs::path& target) {
  std::string prefix = ".";
  prefix += target.filename().string();
  prefix += ".tmp-";
  return prefix;
}

void remove_debris(const fs::path& dir, const fs::path& target) {
  const std::string prefix = temp_prefix(target);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string f = e.path().filename().string();
    if (f.size() == prefix.size() + 6 && f.compare(0, prefix.size(), prefix) == 0 && e.is_regular_file(ec))
      fs::remove(e.path(), ec);
  }
}

// Gives the nameless file `fd` the name `name` (which must not exist). Through /proc first (any
// user); AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH, so it is the second try. False when neither works.
bool link_anonymous(int fd, const std::string& name) {
  const std::string proc = "/proc/self/fd/" + std::to_string(fd);
  if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) return true;
  return ::linkat(fd, "", AT_FDCWD, name.c_str(), AT_EMPTY_PATH) == 0;
}

std::string random_suffix() {
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 gen{std::random_device{}()};
  std::string s(6, 'x');
  for (char& c : s) c = kChars[gen() % (sizeof(kChars) - 1)];
  return s;
}

// Fills fd, fsyncs and closes it; on any failure closes it and rethrows.
void fill_and_close(int fd, const std::string& path, const char* what, const std::string& shown,
                    const std::function<void(const FileSink&)>& fill) {
  try {
    ::fchmod(fd, 0644);  // mkstemp makes 0600, O_TMPFILE the mode given; weights and reports are no secrets
    fill(FileSink(fd, what, path));
    if (::fsync(fd) != 0) throw Error(fmt::format("{}: fsync of '{}' failed: {}", what, shown, errno_str(errno)));
  } catch (...) {
    ::close(fd);
    throw;
  }
  // close() releases the descriptor even when it reports an error.
  if (::close(fd) != 0) throw Error(fmt::format("{}: closing '{}' failed: {}", what, shown, errno_str(errno)));
}

void rename_into_place(const std::string& tmp, const std::string& path, const char* what) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = errno_str(errno);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: renaming '{}' to '{}' failed: {}", what, tmp, path, why));
  }
}

// The anonymous path; false (nothing written) when the file system or kernel has no O_TMPFILE or the
// nameless file cannot be linked, so the caller takes the named path.
bool write_anonymous(const std::string& path, const fs::path& dir, const char* what,
                     const std::function<void(const FileSink&)>& fill) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return false;  // EOPNOTSUPP, EISDIR (kernel without O_TMPFILE), EINVAL, ...
  // Keep a second descriptor for linkat after the writing one is closed (fill_and_close closes it).
  const int link_fd = ::dup(fd);
  if (link_fd < 0) {
    ::close(fd);
    return false;
  }
  try {
    fill_and_close(fd, path, what, path, fill);
  } catch (...) {
    ::close(link_fd);
    throw;
  }
  const std::string prefix = (dir / temp_prefix(path)).string();
  for (int attempt = 0; attempt < 16; ++attempt) {
    const std::string tmp = prefix + random_suffix();
    if (link_anonymous(link_fd, tmp)) {
      ::close(link_fd);
      rename_into_place(tmp, path, what);
      return true;
    }
    if (errno != EEXIST) break;
  }
  ::close(link_fd);
  return false;
}

void write_named(const std::string& path, const fs::path& dir, const char* what,
                 const std::function<void(const FileSink&)>& fill) {
  std::string tmp = (dir / (temp_prefix(path) + "XXXXXX")).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    throw Error(fmt::format("{}: cannot create a temporary file in '{}' for '{}': {}", what, dir.string(), path,
                            errno_str(errno)));
  try {
    fill_and_close(fd, path, what, tmp, fill);
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  rename_into_place(tmp, path, what);
}

}  // namespace

void FileSink::write(const void* data, size_t n) const {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;  // a signal (the trainer's SIGINT handler) is not an error
    if (w <= 0) throw Error(fmt::format("{}: writing '{}' failed: {}", what_, target_, errno_str(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

bool set_anonymous_temporaries(bool on) { return g_anonymous.exchange(on); }

void write_file_atomically(const std::string& path, const char* what, const std::function<void(const FileSink&)>& fill) {
  DUET_CHECK(!path.empty(), "{}: the path is empty", what);
  const fs::path target(path);
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  remove_debris(dir, target);
  const bool done = g_anonymous.load() && write_anonymous(path, dir, what, fill);
  if (!done) write_named(path, dir, what, fill);
  // Make the rename itself durable.
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace duet
