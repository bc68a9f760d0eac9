// Strict JPEG/PNG reading: JPEG through libjpeg-turbo, PNG through libpng. Both decode a
// truncated file as a partly grey image without complaint, so the file's structure is checked
// first: a JPEG needs its end-of-image marker after the image data, a PNG its IEND chunk.
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

// Images declaring more pixels than this are refused before decoding: a few-KB JPEG may declare
// 16000 x 16000, which a decoder would allocate (768 MB of RGB) per loader worker. PIL's
// default limit is 89,478,485; this is a 8192 x 8192 photo.
inline constexpr int64_t kDefaultMaxImagePixels = 8192LL * 8192;

// "" when the bytes' header is a JPEG (libjpeg) or PNG (libpng) header, of at most max_pixels
// pixels, else the problem. Only the header is read, nothing is decoded.
std::string check_image_header(const uint8_t* data, size_t n, int64_t max_pixels = kDefaultMaxImagePixels);

// "" when the file is a complete JPEG or PNG whose header its decoder understands, of at most
// max_pixels pixels, else the problem (the file's name is not part of it). Reads the file.
std::string check_image_file(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);

// Decodes to 3-channel RGB (grey is replicated, alpha dropped). Throws duet::Error
// "'<path>': <problem>" for unreadable, truncated, oversized or undecodable files.
Image decode_image_file(const std::string& path, int64_t max_pixels = kDefaultMaxImagePixels);
Image decode_image_bytes(const uint8_t* data, size_t n, const std::string& name,
                         int64_t max_pixels = kDefaultMaxImagePixels);

}  // namespace duet::datasets
