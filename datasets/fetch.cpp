#include "datasets/fetch.h"
#include <spawn.h>
#include <sys/wait.h>
#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <fmt/format.h>
#include "engine/error.h"

extern char** environ;

namespace duet::datasets {

namespace fs = std::filesystem;

// ---- MD5 (RFC 1321) ------------------------------------------------------------------------------
namespace {

class Md5 {
public:
  void update(const uint8_t* p, size_t n) {
    total_ += n;
    while (n > 0) {
      const size_t take = std::min(n, 64 - fill_);
      std::memcpy(buf_.data() + fill_, p, take);
      fill_ += take;
      p += take;
      n -= take;
      if (fill_ == 64) {
        block(buf_.data());
        fill_ = 0;
      }
    }
  }
  std::string hex() {
    const uint64_t bits = total_ * 8;
    const uint8_t pad = 0x80;
    update(&pad, 1);
    const uint8_t zero = 0;
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(bits >> (8 * i));
    update(len, 8);
    std::string s;
    for (uint32_t v : h_)
      for (int i = 0; i < 4; ++i) s += fmt::format("{:02x}", (v >> (8 * i)) & 0xff);
    return s;
  }

private:
  static uint32_t rotl(uint32_t x, int c) { return (x << c) | (x >> (32 - c)); }
  void block(const uint8_t* p) {
    static constexpr uint32_t K[64] = {
        0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
        0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
        0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
        0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
        0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
        0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
        0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
        0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
    static constexpr int S[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                                  5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                                  4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                                  6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};
    uint32_t m[16];
    for (int i = 0; i < 16; ++i)
      m[i] = static_cast<uint32_t>(p[4 * i]) | (static_cast<uint32_t>(p[4 * i + 1]) << 8) |
             (static_cast<uint32_t>(p[4 * i + 2]) << 16) | (static_cast<uint32_t>(p[4 * i + 3]) << 24);
    uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3];
    for (int i = 0; i < 64; ++i) {
      uint32_t f;
      int g;
      if (i < 16) {
        f = (b & c) | (~b & d);
        g = i;
      } else if (i < 32) {
        f = (d & b) | (~d & c);
        g = (5 * i + 1) % 16;
      } else if (i < 48) {
        f = b ^ c ^ d;
        g = (3 * i + 5) % 16;
      } else {
        f = c ^ (b | ~d);
        g = (7 * i) % 16;
      }
      const uint32_t tmp = d;
      d = c;
      c = b;
      b = b + rotl(a + f + K[i] + m[g], S[i]);
      a = tmp;
    }
    h_[0] += a;
    h_[1] += b;
    h_[2] += c;
    h_[3] += d;
  }
  std::array<uint32_t, 4> h_{0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};
  std::array<uint8_t, 64> buf_{};
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

const std::vector<std::string> kCifar10Files = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                                "data_batch_4.bin", "data_batch_5.bin", "test_batch.bin",
                                                "batches.meta.txt"};

bool all_present(const fs::path& dir, const std::vector<std::string>& files) {
  std::error_code ec;
  for (const std::string& f : files)
    if (!fs::is_regular_file(dir / f, ec)) return false;
  return true;
}

}  // namespace

std::string md5_hex(const void* data, size_t n) {
  Md5 m;
  m.update(static_cast<const uint8_t*>(data), n);
  return m.hex();
}

std::string md5_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DUET_CHECK(in, "md5: cannot open '{}': {}", path, std::strerror(errno));
  Md5 m;
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    m.update(reinterpret_cast<const uint8_t*>(buf.data()), static_cast<size_t>(in.gcount()));
  }
  DUET_CHECK(in.eof(), "md5: read error in '{}'", path);
  return m.hex();
}

void verify_md5(const std::string& path, const std::string& expected) {
  const std::string actual = md5_file(path);
  DUET_CHECK(actual == lower(expected),
             "checksum mismatch for '{}': its MD5 is {}, expected {}; the file is corrupt, incomplete or not the "
             "expected archive",
             path, actual, lower(expected));
}

int run_command(const std::vector<std::string>& argv) {
  DUET_CHECK(!argv.empty(), "run_command: no program given");
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = 0;
  const int rc = posix_spawnp(&pid, args[0], nullptr, nullptr, args.data(), environ);
  if (rc == ENOENT) return 127;
  DUET_CHECK(rc == 0, "cannot run '{}': {}", argv[0], std::strerror(rc));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    DUET_CHECK(errno == EINTR, "waiting for '{}' failed: {}", argv[0], std::strerror(errno));
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

std::vector<std::string> fetchable_datasets() { return {"cifar10"}; }

std::string fetch_dataset(const std::string& name, const std::string& dest, const FetchOptions& opt) {
  if (name == "cifar10" || name == "cifar-10") return fetch_cifar10(dest, opt);
  throw Error(fmt::format("duet data fetch: unknown dataset '{}' (known: cifar10)", name));
}

std::string fetch_cifar10(const std::string& dest, const FetchOptions& opt) {
  const fs::path dir(dest);
  if (all_present(dir, kCifar10Files)) {
    std::printf("cifar10: all files are already in %s\n", dir.c_str());
    return dir.string();
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  DUET_CHECK(!ec, "cifar10: cannot create folder '{}': {}", dest, ec.message());

  std::string archive = opt.archive;
  bool downloaded = false;
  if (archive.empty()) {
    archive = (dir / "cifar-10-binary.tar.gz").string();
    // A complete archive from an earlier, interrupted run is reused.
    if (!(fs::is_regular_file(archive, ec) && md5_file(archive) == lower(opt.md5))) {
      const std::string part = archive + ".part";
      std::printf("cifar10: downloading %s\n", opt.url.c_str());
      std::fflush(stdout);
      int rc = run_command({"curl", "-L", "--fail", "--retry", "3", "-o", part, opt.url});
      if (rc == 127) rc = run_command({"wget", "-O", part, opt.url});
      if (rc != 0) fs::remove(part, ec);
      DUET_CHECK(rc != 127, "cifar10: neither curl nor wget was found; install one, or download {} yourself and "
                            "pass the archive (FetchOptions::archive / --archive)",
                 opt.url);
      DUET_CHECK(rc == 0, "cifar10: downloading {} failed (exit status {})", opt.url, rc);
      fs::rename(part, archive, ec);
      DUET_CHECK(!ec, "cifar10: cannot move '{}' to '{}': {}", part, archive, ec.message());
      downloaded = true;
    }
  }
  DUET_CHECK(fs::is_regular_file(archive, ec), "cifar10: archive '{}' does not exist", archive);
  try {
    verify_md5(archive, opt.md5);
  } catch (const Error&) {
    if (downloaded) fs::remove(archive, ec);  // a corrupt download must not be picked up next time
    throw;
  }
  // The archive holds cifar-10-batches-bin/<files>; the files go straight into dest.
  const int rc = run_command({"tar", "-xzf", archive, "-C", dir.string(), "--strip-components=1"});
  DUET_CHECK(rc != 127, "cifar10: 'tar' was not found; it is needed to extract '{}'", archive);
  DUET_CHECK(rc == 0, "cifar10: extracting '{}' with tar failed (exit status {})", archive, rc);
  for (const std::string& f : kCifar10Files)
    DUET_CHECK(fs::is_regular_file(dir / f, ec), "cifar10: '{}' was not in the archive '{}'", f, archive);
  if (downloaded && !opt.keep_archive) fs::remove(archive, ec);
  std::printf("cifar10: %zu files in %s\n", kCifar10Files.size(), dir.c_str());
  return dir.string();
}

}  // namespace duet::datasets
