// The device error word of the CUDA backend (docs/numerics.md §6): kernels set bits
// with atomicOr and, for the first error of each call, where it happened; the
// host reads it at the next synchronising call (Moe::sync_errors).
#pragma once

#include <cstdint>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cuda {

// Bits beyond the public ErrorBits that only the CUDA backend records.
constexpr uint32_t kErrTokenIdOutOfRange = 1u << 2;  // hash routing: token id outside [0, vocab)

// word[0]: ErrorBits; word[1..3]: token, slot, offending value of the first error.
constexpr int kErrorWords = 4;

}  // namespace nvfp4moe::cuda
