// stb_image compiled into the image fuzzer itself, so that libFuzzer's coverage and the
// sanitizers see inside the decoder (Debian's libstb.so is not instrumented). The same source
// as that library: Debian's libstb-dev header. Its definitions take precedence over the shared
// library's at link time.
#define STB_IMAGE_IMPLEMENTATION
#include <stb/stb_image.h>
