#include "datasets/cifar10.h"
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include "engine/allocator.h"
#include "engine/machine_limits.h"

namespace duet::datasets {

namespace fs = std::filesystem;

namespace {
const std::vector<std::string> kStandardNames = {"airplane", "automobile", "bird",  "cat",  "deer",
                                                 "dog",      "frog",       "horse", "ship", "truck"};

int64_t file_size_or_throw(const std::string& path) {
  std::error_code ec;
  DUET_CHECK(fs::exists(path, ec), "CIFAR-10: file '{}' does not exist", path);
  DUET_CHECK(fs::is_regular_file(path, ec), "CIFAR-10: '{}' is not a regular file", path);
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  DUET_CHECK(!ec, "CIFAR-10: cannot read the size of '{}': {}", path, ec.message());
  return size;
}
}  // namespace

std::vector<std::string> read_cifar10_meta(const std::string& path) {
  std::ifstream in(path);
  DUET_CHECK(in, "CIFAR-10: cannot open '{}': {}", path, std::strerror(errno));
  std::vector<std::string> names;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos) continue;
    names.push_back(line.substr(start));
  }
  DUET_CHECK(names.size() == 10, "CIFAR-10: '{}' should hold 10 class names, one a line; it holds {}", path,
             names.size());
  return names;
}

std::vector<std::string> Cifar10::split_files(const std::string& dir, const std::string& split) {
  std::error_code ec;
  DUET_CHECK(fs::is_directory(dir, ec), "CIFAR-10: folder '{}' does not exist", dir);
  std::vector<std::string> files;
  if (split == "train") {
    for (int i = 1; i <= 5; ++i) {
      const fs::path p = fs::path(dir) / fmt::format("data_batch_{}.bin", i);
      if (fs::exists(p, ec)) files.push_back(p.string());
    }
    DUET_CHECK(!files.empty(), "CIFAR-10: no training batches (data_batch_1.bin .. data_batch_5.bin) in '{}'", dir);
  } else if (split == "test") {
    files.push_back((fs::path(dir) / "test_batch.bin").string());
  } else {
    throw Error(fmt::format("CIFAR-10: unknown split '{}' (expected 'train' or 'test')", split));
  }
  return files;
}

Cifar10::Cifar10(const std::string& dir, const std::string& split) : Cifar10(split_files(dir, split)) {}

Cifar10::Cifar10(const std::vector<std::string>& files) : files_(files) {
  DUET_CHECK(!files.empty(), "CIFAR-10: no files given");
  std::vector<int64_t> counts;
  for (const std::string& f : files) {
    const int64_t size = file_size_or_throw(f);
    DUET_CHECK(size % kRecordBytes == 0,
               "CIFAR-10: '{}' is {} bytes, not a multiple of the record size {} (1 label byte + 3072 pixel bytes); "
               "the file is truncated or not in the binary format",
               f, size, kRecordBytes);
    DUET_CHECK(size > 0, "CIFAR-10: '{}' is empty", f);
    counts.push_back(size / kRecordBytes);
    n_ += counts.back();
  }
  // The images are held in memory: a file larger than the memory the process may use (a sparse
  // or wrong file) is refused before the allocation rather than failing (or swapping) inside it.
  {
    const int64_t need = n_ * kSide * kSide * 3, have = usable_memory_bytes();
    DUET_CHECK(need <= have, "CIFAR-10: {} records need {:.1f} GiB of memory; this machine (or its container) allows {:.1f} GiB",
               n_, static_cast<double>(need) / (1 << 30), static_cast<double>(have) / (1 << 30));
  }
  {
    MemTagGuard tag(MemTag::data);
    pixels_ = Tensor::empty({n_, kSide, kSide, 3}, TensorOptions(DType::u8));
  }
  labels_.resize(static_cast<size_t>(n_));
  uint8_t* px = pixels_.data<uint8_t>();
  constexpr int64_t kPlane = kSide * kSide;
  constexpr int64_t kChunk = 1000;  // records per read
  std::vector<uint8_t> buf(static_cast<size_t>(kChunk * kRecordBytes));
  int64_t base = 0;
  for (size_t fi = 0; fi < files.size(); ++fi) {
    const std::string& f = files[fi];
    std::ifstream in(f, std::ios::binary);
    DUET_CHECK(in, "CIFAR-10: cannot open '{}': {}", f, std::strerror(errno));
    for (int64_t r0 = 0; r0 < counts[fi]; r0 += kChunk) {
      const int64_t nr = std::min(kChunk, counts[fi] - r0);
      in.read(reinterpret_cast<char*>(buf.data()), static_cast<std::streamsize>(nr * kRecordBytes));
      DUET_CHECK(in.gcount() == nr * kRecordBytes, "CIFAR-10: read error in '{}' at record {}", f, r0);
      for (int64_t r = 0; r < nr; ++r) {
        const uint8_t* rec = buf.data() + r * kRecordBytes;
        DUET_CHECK(rec[0] <= 9, "CIFAR-10: '{}' record {} (byte offset {}) has label byte {}; labels are 0..9", f, r0 + r,
                   (r0 + r) * kRecordBytes, rec[0]);
        const int64_t i = base + r0 + r;
        labels_[static_cast<size_t>(i)] = rec[0];
        uint8_t* dst = px + i * kPlane * 3;
        for (int64_t p = 0; p < kPlane; ++p) {
          dst[p * 3 + 0] = rec[1 + p];
          dst[p * 3 + 1] = rec[1 + kPlane + p];
          dst[p * 3 + 2] = rec[1 + 2 * kPlane + p];
        }
      }
    }
    base += counts[fi];
  }
  const fs::path meta = fs::path(files.front()).parent_path() / "batches.meta.txt";
  std::error_code ec;
  names_ = fs::exists(meta, ec) ? read_cifar10_meta(meta.string()) : kStandardNames;
}

int64_t Cifar10::label(int64_t index) const {
  DUET_CHECK(index >= 0 && index < n_, "CIFAR-10: index {} is out of range for {} images", index, n_);
  return labels_[static_cast<size_t>(index)];
}

Sample Cifar10::load(int64_t index) const {
  Sample s;
  s.label = label(index);
  s.image.h = kSide;
  s.image.w = kSide;
  s.image.c = 3;
  const uint8_t* src = pixels_.data<uint8_t>() + index * kSide * kSide * 3;
  s.image.pixels.assign(src, src + kSide * kSide * 3);
  return s;
}

}  // namespace duet::datasets
