// Which GPUs a build can run on, decided from the architecture list it was compiled for (CMake's
// CMAKE_CUDA_ARCHITECTURES, passed in as DUET_CUDA_ARCHS), so that a GPU the build has no code for
// is refused when its context is created, with the rebuild flag, instead of failing at the first
// kernel in the middle of a model. Host-only, no CUDA header: the host tests check the rules.
#pragma once
#include <string>
#include <string_view>

namespace duet::cuda {

// Machine code for sm_XY ("XY-real", or "XY" which CMake builds as both) runs on GPUs of the same
// major version and a minor version of at least Y; PTX for compute_XY ("XY-virtual", or "XY") is
// compiled by the driver for any GPU of capability XY or newer. "native", "all" and "all-major"
// cannot be judged from the list and count as supported. Entries are separated by ',' or ';'.
bool arch_supported(int major, int minor, std::string_view archs);

// The list this build was compiled for, as CMake wrote it.
std::string built_archs();

}  // namespace duet::cuda
