// Writing a file so that a reader only ever sees the old file or the whole new one, and a killed
// write leaves as little as the file system allows. Checkpoints, profile reports, traces and
// predictions are all written through here.
//
// Where the file system supports O_TMPFILE (ext4, xfs, btrfs, tmpfs on Linux 3.11+), the content is
// written into a file without a name, fsynced, given a temporary name with linkat() and renamed over
// the target: a kill during the write (the long part) leaves nothing, because a file without a name
// is freed with its last descriptor. Elsewhere it is written into a named ".<name>.tmp-XXXXXX"
// beside the target, which a kill leaves behind; the next write of the same target removes such
// debris (writers of one file are one run at a time, so no live write's temporary is taken).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace duet {

// Where the bytes go while the file is written; write() throws duet::Error naming the target.
class FileSink {
 public:
  FileSink(int fd, const char* what, const std::string& target) : fd_(fd), what_(what), target_(target) {}
  void write(const void* data, size_t n) const;

 private:
  int fd_;
  const char* what_;
  const std::string& target_;
};

// Writes `path` through `fill`, fsyncs it and renames it into place, then fsyncs the folder. `what`
// opens every error message ("save_safetensors", "cannot write the report"). The folder must exist.
// `fill` may be called twice: again from the start, when a nameless file could not be given a name.
void write_file_atomically(const std::string& path, const char* what, const std::function<void(const FileSink&)>& fill);

// For tests: false makes every write take the named-temporary path, as on a file system without
// O_TMPFILE. Returns the previous setting.
bool set_anonymous_temporaries(bool on);

}  // namespace duet
