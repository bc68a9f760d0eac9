// The CIFAR-10 binary reader on arbitrary bytes, then every record loaded.
#include "datasets/cifar10.h"
#include "fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = duet::fuzz::input_file(data, size, ".bin");
  duet::fuzz::expect_only_duet_errors([&] {
    const duet::datasets::Cifar10 ds(std::vector<std::string>{path});
    for (int64_t i = 0; i < ds.size(); ++i) (void)ds.load(i);
  });
  return 0;
}
