// E4M3 weights to BF16 in registers, exactly: every E4M3 value (4
// significant bits, 2^-9 .. 448) is a BF16 value.
#pragma once

#include <cstdint>

#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "cuda/ptx/sm90_ld_cvt.cuh"

namespace nvfp4moe::cuda {

// Two E4M3 bit patterns (low byte -> low half) -> BF16x2. The hardware
// conversion gives FP16, where every non-zero E4M3 value is a normal number
// (its 7 low mantissa bits zero); dropping 3 of them turns the FP16 bits
// s|e5|m10 into the BF16 bits s|000e5|m7 of value x 2^-112 (still normal,
// zero stays zero), and one exact BF16 multiply by 2^112 restores it. NaN
// (0x7F) does not survive; weights are checked for it when loaded.
__device__ __forceinline__ uint32_t e4m3x2_to_bf16x2(uint16_t pair) {
  const uint32_t h = ptx::cvt_e4m3x2_to_f16x2(pair);
  const uint32_t scaled = ((h >> 3) & 0x0fff0fffu) | (h & 0x80008000u);
  return ptx::mul_bf16x2(scaled, 0x77807780u);  // BF16 2^112 = 0x7780
}

// Four E4M3 bit patterns (byte i) -> BF16x2 of bytes (0, 1) and of bytes
// (2, 3), low byte -> low half, on the integer and FMA pipes only (no
// conversion unit). A byte permute with sign replication gives each half
// the 16 bits sssssssss|e4|m3 (the byte's sign repeated above it); shifted
// left by 4 and masked, they are sign at bit 15, exponent at bits 10..7 and
// mantissa at 6..4: the BF16 pattern of value x 2^-120 (normal or, for
// E4M3's subnormals, BF16's subnormal: the map is linear), which one exact
// BF16 multiply by 2^120 restores. NaN (0x7F) does not survive (see above).
// `mult` may carry a power-of-two factor 2^e with it (BF16x2 of 2^(120 + e),
// -117 <= e <= 7): the products value * 2^e stay normal BF16 values, exact.
constexpr uint32_t kE4m3TwoTo120 = 0x7b807b80u;  // BF16 2^120 in both halves
__device__ __forceinline__ void e4m3x4_to_bf16x2(uint32_t four, uint32_t& b01, uint32_t& b23,
                                                 uint32_t mult = kE4m3TwoTo120) {
  constexpr uint32_t kMask = 0x87f087f0u;  // sign | exponent and mantissa, per half
  const uint32_t z01 = ptx::prmt(four, 0u, 0x9180u), z23 = ptx::prmt(four, 0u, 0xb3a2u);
  b01 = ptx::mul_bf16x2((z01 << 4) & kMask, mult);
  b23 = ptx::mul_bf16x2((z23 << 4) & kMask, mult);
}

}  // namespace nvfp4moe::cuda
