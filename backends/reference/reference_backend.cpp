// The single ReferenceBackend object handed to the registry. The kernels themselves live in the
// files named for their op family (memory.cpp, elementwise.cpp, conv.cpp, ...).
#include "backends/reference/reference_backend.h"

namespace duet {

BackendImpl& reference_backend() {
  static ReferenceBackend instance;
  return instance;
}

}  // namespace duet
