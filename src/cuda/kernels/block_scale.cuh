// The block scale of spec section 2 on the device: s_b = e4m3((amax_b / 6) / g),
// f32(s_b) and d_b = f32(s_b) * g, the bytes and values block_scale_byte,
// e4m3_value and block_dequant_factor give,
// without their IEEE divisions and branchy software E4M3 codec where the
// fast path's domain allows (block_scale_quotient, then the hardware FP8
// conversions). The staging kernels call it once per 16 values; it was ~140
// of their ~650 instructions per block (bench/NOTES.md, session 6).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "cuda/ptx/sm90_ld_cvt.cuh"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

struct BlockScale {
  uint8_t byte;  // s_b, the UE4M3 bit pattern
  float value;   // f32(s_b)
  float d;       // d_b = f32(s_b) * g, the block's dequant factor
};

// rg = fmt::reciprocal_rn(g), computed once per row.
__device__ __forceinline__ BlockScale block_scale(float amax_b, float g, float rg) {
  float q;
  if (fmt::block_scale_quotient(amax_b, g, rg, q)) {
    // q is finite and >= 0: RN with saturation at 448 is e4m3_from_float;
    // the byte is then <= 0x7E and its FP16 value exact.
    const uint8_t b = ptx::cvt_e4m3_from_f32_satfinite(q);
    const uint32_t h2 = ptx::cvt_e4m3x2_to_f16x2(b);
    const float v = __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
    return {b, v, v * g};
  }
  const uint8_t b = fmt::block_scale_byte(amax_b, g);
  return {b, fmt::e4m3_value(b), fmt::block_dequant_factor(b, g)};
}

// Spec section 2 for one block of a GEMM operand row (amax_b its max |x|,
// rg = reciprocal_rn(g)): the QDQ values value(q_i) * f32(s_b) as 8 BF16
// pairs (exact), element 2i in the low half of word i. elements_ok: whether
// every x_i passes fmt::fast_quotient_element_ok (fmt::block_in_quotient_domain,
// or the caller's cheaper check).
__device__ __forceinline__ void qdq_block_bf16(const float (&x)[fmt::kBlock], bool elements_ok, float amax_b, float g,
                                               float rg, uint32_t (&out)[8]) {
  const BlockScale bs = block_scale(amax_b, g, rg);
  float val[fmt::kBlock];
  fmt::quantize_block_values(x, elements_ok, amax_b, bs.d, bs.value, val);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(val[2 * i], val[2 * i + 1]);
    out[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
}

}  // namespace nvfp4moe::cuda
