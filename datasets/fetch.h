// `duet data fetch cifar10`: downloads the official archive with curl or wget (a subprocess, no
// network library), checks its MD5 and extracts it with tar. MD5 and subprocess helpers are here
// too so tests can check the logic on local files without touching the network.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace duet::datasets {

// The binary version from the CIFAR page (https://www.cs.toronto.edu/~kriz/cifar.html), 162 MB.
inline constexpr const char* kCifar10Url = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz";
inline constexpr const char* kCifar10Md5 = "c32a1d4ab5d03f1284b67883e8d87530";

struct FetchOptions {
  std::string url = kCifar10Url;
  std::string md5 = kCifar10Md5;
  std::string archive;        // an archive already on disk: checked and extracted, no download
  bool keep_archive = false;  // keep a downloaded archive after extracting
};

// Known names: "cifar10". Returns the folder that holds the dataset's files; does nothing when
// they are all there already. Throws duet::Error naming the step that failed.
std::string fetch_dataset(const std::string& name, const std::string& dest, const FetchOptions& opt = {});
std::string fetch_cifar10(const std::string& dest, const FetchOptions& opt = {});
std::vector<std::string> fetchable_datasets();

// Lower-case hex MD5 (RFC 1321).
std::string md5_hex(const void* data, size_t n);
std::string md5_file(const std::string& path);
// Throws duet::Error naming the file, the expected and the actual MD5 when they differ.
void verify_md5(const std::string& path, const std::string& expected);

// Runs argv[0] (looked up on PATH) with the arguments, no shell; returns its exit status, 127
// when the program was not found.
int run_command(const std::vector<std::string>& argv);

}  // namespace duet::datasets
