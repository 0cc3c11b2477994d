// Exact dequantization of the tile layout (grouped_gemm_ref.hpp) into
// m16n8k16 / wgmma A fragments, shared by the kernels that read it from
// shared memory (grouped_gemm_ref, sm90_nvfp4_prefill_gemm).
//
// Two 256-entry tables in shared memory: a code byte -> its two E2M1 values
// as BF16x2 (low nibble in the low half), a multiplier byte d -> (T(d), T(d))
// as BF16x2 (scale_multiplier.hpp: NVFP4's s itself, MXFP4's 2^(b - base - 9)).
// value(q) * T(d) is exact in BF16 (at most 6 significant bits, normal), so
// one packed multiply per two values finishes the job.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "cuda/layout/scale_multiplier.hpp"
#include "cuda/layout/tile_layout.hpp"
#include "cuda/ptx/sm80_mma_cp_async.cuh"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

struct TileDequantTables {
  uint32_t code_pair_bf16x2[256];
  uint32_t scale_bf16x2[256];
};

// Every thread of the block takes part; a barrier must follow before use.
__device__ __forceinline__ void fill_tile_dequant_tables(TileDequantTables& t, int tid, int threads) {
  for (int i = tid; i < 256; i += threads) {
    __nv_bfloat162 v = __floats2bfloat162_rn(fmt::e2m1_value(uint8_t(i & 15)), fmt::e2m1_value(uint8_t(i >> 4)));
    t.code_pair_bf16x2[i] = *reinterpret_cast<uint32_t*>(&v);
    __nv_bfloat162 s = __float2bfloat162_rn(tile_scale_value(uint32_t(i)));
    t.scale_bf16x2[i] = *reinterpret_cast<uint32_t*>(&s);
  }
}

// The A fragment of rows r0, r0 + 8 and k16 step c (0..3) of one 128 x 64
// tile-layout chunk (codes, then scales) for the lane with tig = lane % 4:
// a[0] (r0, 2tig..+1), a[1] (r0+8, 2tig..), a[2] (r0, 2tig+8..), a[3] (r0+8, 2tig+8..).
__device__ __forceinline__ void dequant_tile_fragment(const uint8_t* chunk, int r0, int c, int tig,
                                                      const TileDequantTables& t, uint32_t (&a)[4]) {
  const uint8_t* codes = chunk;
  const uint8_t* scales = chunk + kTileCodeBytes;
  // The [0,4,1,5,2,6,3,7] byte order of the layout puts columns 2tig, 2tig+1
  // and 2tig+8, 2tig+9 in one 16-bit word.
  const uint32_t c0 = *reinterpret_cast<const uint16_t*>(codes + r0 * (kTileK / 2) + c * 8 + 2 * tig);
  const uint32_t c1 = *reinterpret_cast<const uint16_t*>(codes + (r0 + 8) * (kTileK / 2) + c * 8 + 2 * tig);
  const uint32_t s0 = t.scale_bf16x2[scales[r0 * (kTileK / 16) + c]];
  const uint32_t s1 = t.scale_bf16x2[scales[(r0 + 8) * (kTileK / 16) + c]];
  a[0] = ptx::mul_bf16x2(t.code_pair_bf16x2[c0 & 0xff], s0);
  a[1] = ptx::mul_bf16x2(t.code_pair_bf16x2[c1 & 0xff], s1);
  a[2] = ptx::mul_bf16x2(t.code_pair_bf16x2[c0 >> 8], s0);
  a[3] = ptx::mul_bf16x2(t.code_pair_bf16x2[c1 >> 8], s1);
}

}  // namespace nvfp4moe::cuda
