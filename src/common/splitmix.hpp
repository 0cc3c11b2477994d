// splitmix64, the project's one pseudo-random generator (synthetic and
// random weights, benchmark inputs, tests), compiled by C++ and CUDA: small,
// fast, and the same sequence on every platform. A stream is a 64-bit state
// advanced by a constant; its outputs are the state's mix.
#pragma once

#include <cstdint>

#ifndef NVFP4_HD
#ifdef __CUDACC__
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif
#endif

namespace nvfp4moe {

constexpr uint64_t kSplitMixGamma = 0x9e3779b97f4a7c15ull;  // the state's increment

// The output function: a bijection of 64-bit words with good avalanche.
NVFP4_HD uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct SplitMix64 {
  uint64_t state = 0;
  NVFP4_HD uint64_t next() { return splitmix64_mix(state += kSplitMixGamma); }
  // Uniform in [0, 1) with 53 random bits.
  NVFP4_HD double uniform() { return double(next() >> 11) * 0x1.0p-53; }
};

}  // namespace nvfp4moe
