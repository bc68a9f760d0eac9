// read_safetensors on arbitrary bytes: a duet::Error or a file, never a crash or another exception.
#include "engine/serialize.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = duet::fuzz::input_file(data, size, ".safetensors");
  duet::fuzz::expect_only_duet_errors([&] { (void)duet::read_safetensors(path); });
  return 0;
}
