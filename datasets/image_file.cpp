#include "datasets/image_file.h"
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <jpeglib.h>
#include <stb_image.h>
#include <fmt/format.h>
#include "engine/error.h"

// JPEG goes through libjpeg-turbo; PNG through stb_image, whose implementation comes from
// Debian's libstb (linked in CMakeLists.txt), not from a STB_IMAGE_IMPLEMENTATION here; its
// failure reason is thread-local (v2.27), so workers may decode concurrently. stb_image 2.27's
// JPEG decoder is not used: fuzz_image found undefined behaviour in it twice (a Huffman table of
// more than 256 codes written past its arrays, and a shift by 33 in its bit reader on corrupt
// entropy-coded data), both fixed upstream after Debian 12's version.

namespace duet::datasets {

namespace {

bool is_jpeg(const uint8_t* d, size_t n) { return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF; }
const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
bool is_png(const uint8_t* d, size_t n) { return n >= 8 && std::memcmp(d, kPngSignature, 8) == 0; }

// A Huffman table declares at most 256 codes; a table of more is refused here with a clear message
// (stb_image 2.27, which once decoded duet's JPEGs, overflowed its arrays on one: fuzz_image).
// Every DHT segment, before or between scans, is checked.
std::string check_dht(const uint8_t* d, size_t begin, size_t end) {
  for (size_t p = begin; p < end;) {
    if (p + 17 > end) return fmt::format("corrupt JPEG: Huffman table segment at byte {} is cut short", begin - 4);
    size_t codes = 0;
    for (size_t i = 1; i <= 16; ++i) codes += d[p + i];
    if (codes > 256)
      return fmt::format("corrupt JPEG: Huffman table at byte {} declares {} codes (at most 256)", p, codes);
    p += 17 + codes;
    if (p > end) return fmt::format("corrupt JPEG: Huffman table segment at byte {} is cut short", begin - 4);
  }
  return "";
}

std::string check_jpeg(const uint8_t* d, size_t n) {
  // Segments carry their length; walk them. After a start-of-scan comes entropy-coded data, in
  // which 0xFF is always stuffed (FF 00) or a restart marker (FF D0..D7); any other FF xx is the
  // next marker (a progressive JPEG has tables and scans after the first scan). An FF D9 after a
  // scan is the real end of the image; truncated files stop before it.
  size_t pos = 2;
  bool in_scan = false;
  while (true) {
    if (in_scan) {
      while (pos + 1 < n && !(d[pos] == 0xFF && d[pos + 1] != 0x00 && (d[pos + 1] < 0xD0 || d[pos + 1] > 0xD7)))
        ++pos;
      if (pos + 1 >= n)
        return fmt::format("truncated: no end-of-image marker (FF D9) after the image data; the file ({} bytes) is cut "
                           "short",
                           n);
    }
    // stb_image skips bytes that are not a marker between header segments ("extra padding"),
    // so a table it reads may sit behind junk that a strict walk would take for a marker and
    // skip by a bogus length. Skipping to the next FF everywhere sees every table stb can reach;
    // after the header stb refuses such junk, so nothing valid is refused here for it.
    while (pos < n && d[pos] != 0xFF) ++pos;
    while (pos < n && d[pos] == 0xFF) ++pos;  // fill bytes before a marker
    if (pos >= n) return fmt::format("truncated: the file ends in the JPEG header ({} bytes)", n);
    const uint8_t m = d[pos++];
    if (m == 0xD9) return in_scan ? "" : "the JPEG ends (end-of-image marker) before any image data";
    if (m == 0x01 || (m >= 0xD0 && m <= 0xD8)) continue;  // markers without a length
    if (pos + 2 > n) return fmt::format("truncated: the file ends in the JPEG header ({} bytes)", n);
    const size_t len = (static_cast<size_t>(d[pos]) << 8) | d[pos + 1];
    if (len < 2) return fmt::format("corrupt JPEG: segment FF{:02X} at byte {} has length {}", m, pos - 2, len);
    if (pos + len > n)
      return fmt::format("truncated: the file ends inside JPEG segment FF{:02X} at byte {} ({} bytes)", m, pos - 2, n);
    if (m == 0xC4)
      if (std::string bad = check_dht(d, pos + 2, pos + len); !bad.empty()) return bad;
    pos += len;
    if (m == 0xDA) in_scan = true;  // start of scan: entropy-coded data follows
  }
}

std::string check_png(const uint8_t* d, size_t n) {
  size_t pos = 8;
  while (pos + 8 <= n) {
    const size_t len = (static_cast<size_t>(d[pos]) << 24) | (static_cast<size_t>(d[pos + 1]) << 16) |
                       (static_cast<size_t>(d[pos + 2]) << 8) | d[pos + 3];
    const std::string type(reinterpret_cast<const char*>(d + pos + 4), 4);
    if (len > n || pos + 12 + len > n)
      return fmt::format("truncated: the file ends inside PNG chunk '{}' at byte {} ({} bytes)", type, pos, n);
    if (type == "IEND") return "";
    pos += 12 + len;
  }
  return fmt::format("truncated: no IEND chunk at the end of the PNG; the file ({} bytes) is cut short", n);
}

std::string first_bytes(const uint8_t* d, size_t n) {
  std::string s;
  for (size_t i = 0; i < std::min<size_t>(n, 8); ++i) {
    const char ch = static_cast<char>(d[i]);
    s += (ch >= 32 && ch < 127) ? std::string(1, ch) : fmt::format("\\x{:02x}", d[i]);
  }
  return s;
}

}  // namespace

std::string check_image_bytes(const uint8_t* data, size_t n) {
  if (n == 0) return "empty file (0 bytes)";
  if (is_jpeg(data, n)) return check_jpeg(data, n);
  if (is_png(data, n)) return check_png(data, n);
  if ((n < 8 && std::memcmp(data, kPngSignature, n) == 0) || (n < 3 && data[0] == 0xFF && (n == 1 || data[1] == 0xD8)))
    return fmt::format("truncated: the file ends after {} bytes, inside the image signature", n);
  return fmt::format("not a JPEG or PNG image (the file starts with \"{}\")", first_bytes(data, n));
}

std::vector<uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  DUET_CHECK(in, "'{}': cannot open: {}", path, std::strerror(errno));
  const std::streamoff size = in.tellg();
  DUET_CHECK(size >= 0, "'{}': cannot read its size", path);
  std::vector<uint8_t> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0) in.read(reinterpret_cast<char*>(bytes.data()), size);
  DUET_CHECK(in.gcount() == size, "'{}': read {} of {} bytes", path, in.gcount(), size);
  return bytes;
}

namespace {
// libjpeg reports errors through error_exit, which must not return: it jumps back to read_jpeg's
// setjmp with the message. Warnings (extraneous bytes before a marker, say) are ignored, as PIL
// does: the structure check above already refused truncated files.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};
[[noreturn]] void jpeg_error_exit(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  (*c->err->format_message)(c, e->message);
  std::longjmp(e->jump, 1);
}
void jpeg_ignore_message(j_common_ptr, int) {}

enum class JpegRead { ok, failed, too_large };

// Reads the header (and with `pixels`, decodes to RGB, grey replicated). Only trivially
// destructible objects live in this frame, as a longjmp through it requires.
JpegRead read_jpeg(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>* pixels, int64_t& w,
                   int64_t& h, JpegErrors& err) {
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_ignore_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return JpegRead::failed;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&cinfo, TRUE);
  w = cinfo.image_width;
  h = cinfo.image_height;
  if (w * h > max_pixels || !pixels) {
    jpeg_destroy_decompress(&cinfo);
    return w * h > max_pixels ? JpegRead::too_large : JpegRead::ok;
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const size_t row_bytes = static_cast<size_t>(cinfo.output_width) * 3;
  pixels->resize(row_bytes * cinfo.output_height);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = pixels->data() + row_bytes * cinfo.output_scanline;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return JpegRead::ok;
}

std::string too_many_pixels(int64_t w, int64_t h, int64_t max_pixels) {
  return fmt::format("the image declares {} x {} = {} pixels, more than the limit of {} (--max-image-pixels raises it)",
                     w, h, w * h, max_pixels);
}
}  // namespace

std::string check_image_header(const uint8_t* data, size_t n, int64_t max_pixels) {
  if (n >= (1ull << 31)) return fmt::format("file of {} bytes is too large to decode", n);
  if (is_jpeg(data, n)) {
    int64_t w = 0, h = 0;
    JpegErrors err;
    switch (read_jpeg(data, n, max_pixels, nullptr, w, h, err)) {
      case JpegRead::failed: return fmt::format("unreadable JPEG header ({})", err.message);
      case JpegRead::too_large: return too_many_pixels(w, h, max_pixels);
      case JpegRead::ok: break;
    }
    return w > 0 && h > 0 ? "" : fmt::format("the header declares an image of {} x {} pixels", w, h);
  }
  int w = 0, h = 0, comp = 0;
  if (!stbi_info_from_memory(data, static_cast<int>(n), &w, &h, &comp))
    return fmt::format("unreadable image header ({})", stbi_failure_reason());
  if (w <= 0 || h <= 0) return fmt::format("the header declares an image of {} x {} pixels", w, h);
  if (static_cast<int64_t>(w) * h > max_pixels) return too_many_pixels(w, h, max_pixels);
  return "";
}

std::string check_image_file(const std::string& path, int64_t max_pixels) {
  std::vector<uint8_t> bytes;
  try {
    bytes = read_file_bytes(path);
  } catch (const Error& e) {
    return e.what();
  }
  std::string problem = check_image_bytes(bytes.data(), bytes.size());
  if (!problem.empty()) return problem;
  return check_image_header(bytes.data(), bytes.size(), max_pixels);
}

Image decode_image_bytes(const uint8_t* data, size_t n, const std::string& name, int64_t max_pixels) {
  std::string problem = check_image_bytes(data, n);
  if (problem.empty()) problem = check_image_header(data, n, max_pixels);
  DUET_CHECK(problem.empty(), "'{}': {}", name, problem);
  if (is_jpeg(data, n)) {
    Image img;
    int64_t w = 0, h = 0;
    JpegErrors err;
    const JpegRead r = read_jpeg(data, n, max_pixels, &img.pixels, w, h, err);
    DUET_CHECK(r == JpegRead::ok, "'{}': cannot decode ({})", name,
               r == JpegRead::too_large ? too_many_pixels(w, h, max_pixels) : std::string(err.message));
    img.h = h;
    img.w = w;
    img.c = 3;
    return img;
  }
  int w = 0, h = 0, comp = 0;
  uint8_t* px = stbi_load_from_memory(data, static_cast<int>(n), &w, &h, &comp, 3);
  DUET_CHECK(px != nullptr, "'{}': cannot decode ({})", name, stbi_failure_reason());
  Image img;
  img.h = h;
  img.w = w;
  img.c = 3;
  img.pixels.assign(px, px + static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  stbi_image_free(px);
  return img;
}

Image decode_image_file(const std::string& path, int64_t max_pixels) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return decode_image_bytes(bytes.data(), bytes.size(), path, max_pixels);
}

}  // namespace duet::datasets
