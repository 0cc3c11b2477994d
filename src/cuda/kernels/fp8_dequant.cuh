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

}  // namespace nvfp4moe::cuda
