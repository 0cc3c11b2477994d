// Exact dequantization of the fragment layout (fragment_layout.hpp)
// into m16n8k16 / wgmma A fragments, shared by the kernels that read it:
// sm90_nvfp4_decode_gemm (decode, from registers) and sm90_nvfp4_prefill_gemm
// (prefill, from shared memory).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/layout/fragment_layout.hpp"
#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "cuda/ptx/sm90_ld_cvt.cuh"

namespace nvfp4moe::cuda {

// Component r (compile-time after unrolling) of a 16-byte register group.
__device__ __forceinline__ uint32_t part(const uint4& v, int r) {
  return r == 0 ? v.x : r == 1 ? v.y : r == 2 ? v.z : v.w;
}

// A lane's multiplier-byte pair (rows g, g + 8; low byte row g) -> the BF16x2
// multipliers M(d) in both halves (scale_multiplier.hpp): two byte
// extractions and two multiply-adds, the same for NVFP4 and MXFP4 weights.
NVFP4_HD void scale_multipliers(uint32_t pair, uint32_t& row_g, uint32_t& row_g8) {
  row_g = scale_multiplier_bf16x2(pair & 0xffu);
  row_g8 = scale_multiplier_bf16x2((pair >> 8) & 0xffu);
}

// One lane's 16-byte fragment of a chunk (4 k16 steps of one m-tile) and its
// multiplier pair -> the A fragments of the 4 steps, value(q) * M(d) * 2^-126
// in BF16 (exact; the epilogue multiplies by kFragEpilogue and g_w).
__device__ __forceinline__ void dequant_fragment_chunk(const uint4& frag, uint32_t scale_pair, uint32_t (&a)[4][4]) {
  uint32_t s_g, s_g8;
  scale_multipliers(scale_pair, s_g, s_g8);
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    unpack_fragment_word(part(frag, s), a[s]);
    a[s][0] = ptx::mul_bf16x2(a[s][0], s_g);
    a[s][1] = ptx::mul_bf16x2(a[s][1], s_g8);
    a[s][2] = ptx::mul_bf16x2(a[s][2], s_g);
    a[s][3] = ptx::mul_bf16x2(a[s][3], s_g8);
  }
}

}  // namespace nvfp4moe::cuda
