// What `duet selftest --device cuda` prints around the op table's results (the table and its
// runner are opcheck/; cli/selftest.cpp runs it): the GPU, its driver, runtime, cuDNN and
// cuBLAS versions and its telemetry before the cases, the caching allocator's counters after.
#pragma once
#include <string>

namespace duet {

std::string cuda_selftest_header(int device);
std::string cuda_selftest_footer(int device);

}  // namespace duet
