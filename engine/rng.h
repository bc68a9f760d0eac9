// Counter-based random numbers shared by every backend. Element i of a draw is a pure function of
// (seed, offset + i), so the CPU and CUDA kernels produce bit-identical uniform streams whatever
// their thread count, and a draw can be replayed from its offset (Generator::reserve hands these
// out). Header-only and free of the engine so .cu files can include it as well.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define DUET_HOST_DEVICE __host__ __device__
#else
#define DUET_HOST_DEVICE
#endif

namespace duet {

// Steele, Lea and Flood's SplitMix64 finaliser: a bijection on 64-bit words whose outputs for
// consecutive inputs pass BigCrush, which is what lets a plain counter serve as the state.
DUET_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A double in [0, 1) on the 2^-53 grid. Hashing the counter before mixing in the seed keeps the
// streams of seeds s and s+1 from being shifted copies of each other.
DUET_HOST_DEVICE inline double uniform01(uint64_t seed, uint64_t counter) {
  return static_cast<double>(splitmix64(seed ^ splitmix64(counter)) >> 11) * 0x1.0p-53;
}

}  // namespace duet
