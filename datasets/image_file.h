// Strict JPEG/PNG reading through stb_image. stb_image decodes a truncated JPEG as a partly grey
// image without complaint, so the file's structure is checked first: a JPEG needs its
// end-of-image marker after the image data, a PNG its IEND chunk.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "datasets/transforms.h"

namespace duet::datasets {

// "" when the bytes hold a complete JPEG or PNG, else what is wrong ("truncated: ...").
std::string check_image_bytes(const uint8_t* data, size_t n);

// Reads the whole file; throws duet::Error naming the path when it can't be opened.
std::vector<uint8_t> read_file_bytes(const std::string& path);

// "" when the file is a complete JPEG or PNG whose header stb_image understands, else the
// problem (the file's name is not part of it). Reads the file.
std::string check_image_file(const std::string& path);

// Decodes to 3-channel RGB (grey is replicated, alpha dropped). Throws duet::Error
// "'<path>': <problem>" for unreadable, truncated or undecodable files.
Image decode_image_file(const std::string& path);
Image decode_image_bytes(const uint8_t* data, size_t n, const std::string& name);

}  // namespace duet::datasets
