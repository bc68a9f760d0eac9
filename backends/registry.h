// Factories of the backends built into this binary (see backends/registry.cpp).
#pragma once
#include "engine/backend.h"

namespace duet {
BackendImpl& reference_backend();
#ifdef DUET_HAVE_DNNL
BackendImpl& cpu_backend();
#endif
#ifdef DUET_HAVE_CUDA
BackendImpl& cuda_backend();
Allocator& cuda_allocator(int device);
int cuda_device_count();  // 0 when no driver or no device
#endif
}  // namespace duet
