// The block scale of docs/numerics.md §2 on the device: s_b = e4m3(clamp(
// amax_b / f32(6 g), 2^-9, 448)) with an all-zero block at 1.0, f32(s_b) and
// d_b = f32(s_b) * g — the bytes and values block_scale_byte, e4m3_value and
// block_dequant_factor give, without their IEEE division and branchy
// software E4M3 codec where the fast path's domain allows
// (fmt::block_scale_quotient, then the hardware FP8 conversions). The
// staging kernels call it once per 16 values.
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

// div = fmt::block_scale_divisor(g), computed once per row.
__device__ __forceinline__ BlockScale block_scale(float amax_b, const fmt::BlockScaleDivisor& div) {
  float v;
  if (fmt::block_scale_quotient(amax_b, div, v)) {
    // v is finite and in [2^-9, 2^60]: the hardware's RN conversion with
    // saturation at 448 is e4m3_from_float(clamp_block_scale(v)) (it does not
    // clamp small values up to 2^-9: block_scale_quotient did); the byte is
    // then in 0x01..0x7E and its FP16 value exact.
    const uint8_t b = ptx::cvt_e4m3_from_f32_satfinite(v);
    const uint32_t h2 = ptx::cvt_e4m3x2_to_f16x2(b);
    const float sv = __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
    return {b, sv, fmt::mul_rn(sv, div.g)};
  }
  const uint8_t b = fmt::block_scale_byte(amax_b, div.g);
  return {b, fmt::e4m3_value(b), fmt::block_dequant_factor(b, div.g)};
}

// docs/numerics.md §2 for one block of a GEMM operand row (amax_b its max
// |x|, div = fmt::block_scale_divisor(g)): the QDQ values value(q_i) *
// f32(s_b) as 8 BF16 pairs (exact), element 2i in the low half of word i.
// elements_ok: whether every x_i passes fmt::fast_quotient_element_ok
// (fmt::block_in_quotient_domain, or the caller's cheaper check).
__device__ __forceinline__ void qdq_block_bf16(const float (&x)[fmt::kBlock], bool elements_ok, float amax_b,
                                               const fmt::BlockScaleDivisor& div, uint32_t (&out)[8]) {
  const BlockScale bs = block_scale(amax_b, div);
  float val[fmt::kBlock];
  fmt::quantize_block_values(x, elements_ok, amax_b, bs.d, bs.value, val);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const __nv_bfloat162 pair = __floats2bfloat162_rn(val[2 * i], val[2 * i + 1]);
    out[i] = *reinterpret_cast<const uint32_t*>(&pair);
  }
}

}  // namespace nvfp4moe::cuda
