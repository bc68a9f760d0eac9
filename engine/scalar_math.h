// Per-element arithmetic that every backend must compute the same way, written once as functions
// that compile for the host and, under nvcc, for the GPU: the reference loops, the cpu backend's
// OpenMP loops and the CUDA kernels all call these. It includes no engine header that pulls in fmt
// or the tensor, so nvcc can parse it.
#pragma once

#if defined(__CUDACC__)
#define DUET_HD __host__ __device__
#else
#define DUET_HD
#endif

namespace duet {

template <class T> DUET_HD inline bool is_nan(T v) { return v != v; }

// max/min that propagate NaN, as PyTorch's maximum/minimum/amax/amin do (std::max would drop a NaN
// in its second argument).
template <class T> DUET_HD inline T max_nan(T a, T b) { return is_nan(a) ? a : is_nan(b) ? b : (a < b ? b : a); }
template <class T> DUET_HD inline T min_nan(T a, T b) { return is_nan(a) ? a : is_nan(b) ? b : (b < a ? b : a); }

}  // namespace duet
