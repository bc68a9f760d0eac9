// The image checks and decoding (libjpeg-turbo, libpng) on arbitrary bytes, as the image-folder
// loader runs them. The decoders are Debian's libraries, not instrumented (OSS-Fuzz fuzzes them
// upstream): this target finds crashes in them and faults in duet's checks and error handling.
// The pixel limit is small enough that libFuzzer's memory limit is not what stops a decode.
#include "datasets/image_file.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  (void)duet::datasets::check_image_bytes(data, size);
  duet::fuzz::expect_only_duet_errors(
      [&] { (void)duet::datasets::decode_image_bytes(data, size, "fuzz", int64_t{1} << 22); });
  return 0;
}
