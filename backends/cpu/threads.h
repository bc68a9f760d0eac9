// Thread count of the cpu backend. oneDNN is built on the OpenMP runtime (libgomp) here, so one
// setting governs both its primitives and our own `#pragma omp` loops.
#pragma once

namespace duet {
void set_num_threads(int n);  // n >= 1
int num_threads();
}  // namespace duet
