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

// The FP8 form (layout/fp8_operand.hpp): two BF16x2 registers x, y whose
// values are A * 2^-120 for E4M3 values A -> the E4M3 bytes (x.h0, x.h1,
// y.h0, y.h1): bits 10..4 of each half by one permute of the shifted words,
// the signs by one of the words. Bit for bit fp8_pack_ref.
__device__ __forceinline__ uint32_t fp8_pack(uint32_t x, uint32_t y) {
  return ptx::prmt(x >> 4, y >> 4, 0x6420u) | (ptx::prmt(x, y, 0x7531u) & 0x80808080u);
}

// One lane's 16-byte fragment of a chunk, its multiplier pair and the bias
// words of its rows g, g + 8 (fp8_row_bias_bf16x2) -> the E4M3 A fragments of
// the chunk's two k32 steps: step u register 0 / 1 holds rows g / g + 8 from
// BF16 step 2u's registers 0, 2 / 1, 3, registers 2 / 3 those of step 2u + 1,
// so byte b of register j is column 16 t + 8 u + 4 (j >> 1) + b
// (fp8_operand_column). Each BF16 product is exact, as in dequant_fragment_chunk.
__device__ __forceinline__ void dequant_fragment_chunk_fp8(const uint4& frag, uint32_t scale_pair, uint32_t bias_g,
                                                           uint32_t bias_g8, uint32_t (&a)[2][4]) {
  const uint32_t s_g = (scale_pair & 0xffu) * 0x00100010u + bias_g;
  const uint32_t s_g8 = ((scale_pair >> 8) & 0xffu) * 0x00100010u + bias_g8;
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    uint32_t lo[4], hi[4];
    unpack_fragment_word(part(frag, 2 * u), lo);
    unpack_fragment_word(part(frag, 2 * u + 1), hi);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = ptx::mul_bf16x2(lo[i], i % 2 == 0 ? s_g : s_g8);
      hi[i] = ptx::mul_bf16x2(hi[i], i % 2 == 0 ? s_g : s_g8);
    }
    a[u][0] = fp8_pack(lo[0], lo[2]);
    a[u][1] = fp8_pack(lo[1], lo[3]);
    a[u][2] = fp8_pack(hi[0], hi[2]);
    a[u][3] = fp8_pack(hi[1], hi[3]);
  }
}

}  // namespace nvfp4moe::cuda
