#include "datasets/image_file.h"
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <jpeglib.h>
#include <png.h>
#include <fmt/format.h>
#include "engine/error.h"

// JPEG goes through libjpeg-turbo and PNG through libpng, the decoders PIL uses, both fuzzed
// upstream by OSS-Fuzz. duet decoded with Debian 12's stb_image 2.27 until fuzz_image found
// undefined behaviour in it three times (a JPEG Huffman table of more than 256 codes written past
// its arrays, a shift by 33 in its JPEG bit reader, a memcpy to a null pointer for a PNG whose
// first IDAT chunk is empty), all of them fixed upstream only after that version. Both decoders
// keep their state per call, so loader workers decode concurrently.

namespace duet::datasets {

namespace {

bool is_jpeg(const uint8_t* d, size_t n) { return n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF; }
const uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
bool is_png(const uint8_t* d, size_t n) { return n >= 8 && std::memcmp(d, kPngSignature, 8) == 0; }

// A Huffman table declares at most 256 codes; a table of more is refused here with a clear message
// (stb_image 2.27, which once decoded duet's JPEGs, overflowed its arrays on one: fuzz_image;
// libjpeg refuses it too). Every DHT segment, before or between scans, is checked.
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
    // Decoders skip bytes that are not a marker between header segments ("extra padding"; stb
    // did, libjpeg does with a warning), so a table may sit behind junk that a strict walk would
    // take for a marker and skip by a bogus length. Skipping to the next FF everywhere sees every
    // table a decoder can reach.
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

enum class Read { ok, failed, too_large };

// Reads the header (and with `pixels`, decodes to RGB, grey replicated); on failure `message`
// says why. Apart from the caller's objects, only trivially destructible objects live in this
// frame, as a longjmp through it requires.
Read read_jpeg(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>* pixels, int64_t& w, int64_t& h,
               std::string& message) {
  JpegErrors err;
  jpeg_decompress_struct cinfo;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  err.mgr.emit_message = jpeg_ignore_message;
  err.message[0] = '\0';
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    message = err.message;
    return Read::failed;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(n));
  jpeg_read_header(&cinfo, TRUE);
  w = cinfo.image_width;
  h = cinfo.image_height;
  if (w * h > max_pixels || !pixels) {
    jpeg_destroy_decompress(&cinfo);
    return w * h > max_pixels ? Read::too_large : Read::ok;
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
  return Read::ok;
}

// libpng, the same way: errors longjmp back to read_png's setjmp with the message; warnings
// (a bad CRC in an ancillary chunk, say) are ignored. The transforms give 8-bit RGB as PIL's
// convert("RGB") does: palette and grey expanded, 16-bit samples reduced to their high byte,
// alpha dropped (not composited), no gamma applied.
struct PngErrors {
  std::jmp_buf jump;
  char message[200];
};
[[noreturn]] void png_error_exit(png_structp png, png_const_charp msg) {
  auto* e = static_cast<PngErrors*>(png_get_error_ptr(png));
  std::snprintf(e->message, sizeof e->message, "%s", msg);
  std::longjmp(e->jump, 1);
}
void png_ignore_warning(png_structp, png_const_charp) {}

struct PngSource {
  const uint8_t* data;
  size_t size, pos;
};
void png_read_memory(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "the file ends inside a chunk");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}

// As read_jpeg, for PNG.
Read read_png(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>* pixels, int64_t& w, int64_t& h,
              std::string& message) {
  PngErrors err;
  err.message[0] = '\0';
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &err, png_error_exit, png_ignore_warning);
  png_infop info = png ? png_create_info_struct(png) : nullptr;
  PngSource src{data, n, 0};
  if (!png || !info) {
    if (png) png_destroy_read_struct(&png, nullptr, nullptr);
    message = "libpng could not start";
    return Read::failed;
  }
  if (setjmp(err.jump)) {
    png_destroy_read_struct(&png, &info, nullptr);
    message = err.message;
    return Read::failed;
  }
  png_set_read_fn(png, &src, png_read_memory);
  png_read_info(png, info);
  w = png_get_image_width(png, info);
  h = png_get_image_height(png, info);
  if (w * h > max_pixels || !pixels) {
    png_destroy_read_struct(&png, &info, nullptr);
    return w * h > max_pixels ? Read::too_large : Read::ok;
  }
  png_set_expand(png);         // palette to RGB, grey below 8 bits to 8, tRNS to alpha
  png_set_strip_16(png);       // 16-bit samples to their high byte
  png_set_strip_alpha(png);    // alpha dropped
  png_set_gray_to_rgb(png);    // grey replicated
  const int passes = png_set_interlace_handling(png);
  png_read_update_info(png, info);
  const size_t row_bytes = static_cast<size_t>(w) * 3;
  if (png_get_rowbytes(png, info) != row_bytes) png_error(png, "unexpected row size after conversion to RGB");
  pixels->resize(row_bytes * static_cast<size_t>(h));
  for (int pass = 0; pass < passes; ++pass)
    for (int64_t y = 0; y < h; ++y) png_read_row(png, pixels->data() + row_bytes * static_cast<size_t>(y), nullptr);
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  return Read::ok;
}

// The reader of the bytes' format (check_image_bytes has established it is JPEG or PNG).
Read read_image(const uint8_t* data, size_t n, int64_t max_pixels, std::vector<uint8_t>* pixels, int64_t& w,
                int64_t& h, std::string& message) {
  return (is_jpeg(data, n) ? read_jpeg : read_png)(data, n, max_pixels, pixels, w, h, message);
}

std::string too_many_pixels(int64_t w, int64_t h, int64_t max_pixels) {
  return fmt::format("the image declares {} x {} = {} pixels, more than the limit of {} (--max-image-pixels raises it)",
                     w, h, w * h, max_pixels);
}
}  // namespace

std::string check_image_header(const uint8_t* data, size_t n, int64_t max_pixels) {
  if (n >= (1ull << 31)) return fmt::format("file of {} bytes is too large to decode", n);
  if (!is_jpeg(data, n) && !is_png(data, n)) return check_image_bytes(data, n);
  int64_t w = 0, h = 0;
  std::string message;
  switch (read_image(data, n, max_pixels, nullptr, w, h, message)) {
    case Read::failed: return fmt::format("unreadable {} header ({})", is_jpeg(data, n) ? "JPEG" : "PNG", message);
    case Read::too_large: return too_many_pixels(w, h, max_pixels);
    case Read::ok: break;
  }
  return w > 0 && h > 0 ? "" : fmt::format("the header declares an image of {} x {} pixels", w, h);
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
  // The structure check; the header (size, pixel limit) is read once, by the decoder itself.
  const std::string problem = check_image_bytes(data, n);
  DUET_CHECK(problem.empty(), "'{}': {}", name, problem);
  DUET_CHECK(n < (1ull << 31), "'{}': file of {} bytes is too large to decode", name, n);
  Image img;
  int64_t w = 0, h = 0;
  std::string message;
  const Read r = read_image(data, n, max_pixels, &img.pixels, w, h, message);
  DUET_CHECK(r == Read::ok, "'{}': cannot decode ({})", name, r == Read::too_large ? too_many_pixels(w, h, max_pixels) : message);
  img.h = h;
  img.w = w;
  img.c = 3;
  return img;
}

Image decode_image_file(const std::string& path, int64_t max_pixels) {
  const std::vector<uint8_t> bytes = read_file_bytes(path);
  return decode_image_bytes(bytes.data(), bytes.size(), path, max_pixels);
}

}  // namespace duet::datasets
