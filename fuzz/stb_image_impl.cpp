// stb_image (duet's PNG decoder) compiled into the image fuzzer itself, so that libFuzzer's
// coverage and the sanitizers see inside the decoder (Debian's libstb.so is not instrumented).
// The same source as that library: Debian's libstb-dev header. Its definitions take precedence
// over the shared library's at link time. JPEGs go to Debian's libjpeg-turbo, not instrumented
// here (OSS-Fuzz fuzzes it upstream): the fuzzer sees its crashes and duet's handling of its errors.
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
