// The FP8 form of the wgmma prefill GEMM (sm90_nvfp4_prefill_gemm with
// Operand::Fp8): its activation operand and its weight rows.
//
// Operand. Rows of E4M3 bytes with one FP32 power-of-two scale per 128
// columns (a wgmma B operand reads 128 bytes of K per swizzle row: one
// stage). Inside each 64-column chunk the bytes are in the FP8 k-slot
// order of the fragment layout (fragment_layout.hpp): the k32 step u, FP8
// register j (rows g / g + 8 alternate, j >> 1 = h the upper 16 k-slots) of
// lane t holds the logical columns 16 t + 8 u + 4 h + 0..3, so byte
// 32 u + 16 h + 4 t + b of a chunk is logical column 16 t + 8 u + 4 h + b.
// Those are the columns the BF16 fragment words 2u (h = 0) and 2u + 1
// (h = 1) of the lane hold, so the weights' A fragments come from the same
// codes as the BF16 form's.
//
// The operand comes from the BF16 operand rows of the `fp8` activation mode
// (docs/numerics.md §7: every 128-column block is e4m3(q) * s with s a power
// of two); fp8_operand_scale picks the smallest power of two s' with
// max |x| <= 448 s', so every x / s' is an E4M3 value again (s' <= s, and
// x / s' = q * s / s' stays at most 448) and the bytes are exact.
//
// Weight rows. The consumer turns each BF16 fragment product into E4M3 by
// bits: it multiplies the codes by M'(d) = M(d) * 2^(-100 - E) with a row
// exponent E, so that the product is A * 2^-120 for the row's E4M3 weight
// values A; bits 10..4 of such a BF16 number (exponent at most 15) are A's
// E4M3 magnitude bits, the sign moves from bit 15 to bit 7. The true weight
// is A * 2^E * g_w (NVFP4: g; MXFP4: the row group's factor), which the
// epilogue applies in FP32. fp8_weight_rows finds E per row from
// e4m3_row_shifts (NVFP4 with g = 1: the global scale stays in the
// epilogue), or says why a row has none.
#pragma once

#include <cstdint>
#include <string>

#include "cuda/layout/fragment_layout.hpp"
#include "cuda/layout/scale_multiplier.hpp"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

constexpr int kFp8OperandBlock = 128;  // columns per operand scale (act_quant's block)

// Byte position of logical column `col` in an FP8 operand row.
template <typename Int>
NVFP4_HD Int fp8_operand_column(Int col) {
  const Int chunk = col / kMmaChunkK, c = col % kMmaChunkK;
  const Int t = c / 16, u = (c / 8) % 2, h = (c / 4) % 2, b = c % 4;
  return chunk * kMmaChunkK + 32 * u + 16 * h + 4 * t + b;
}

// The operand scale of a block whose largest magnitude is `amax`: the
// smallest power of two s with amax <= 448 s (1 for an all-zero block, NaN
// when amax is NaN or infinite).
NVFP4_HD float fp8_operand_scale(float amax) {
  if (!fmt::is_finite(amax)) return fmt::bits_to_float(0x7fc00000u);
  if (amax == 0.0f) return 1.0f;
  const uint32_t u = fmt::float_to_bits(amax);
  const int e = int((u >> 23) & 0xffu);
  if (e == 0) return fmt::bits_to_float(1u << 15);  // FP32 subnormal: 2^-134 (256 s > 2^-126)
  // 448 = 1.75 * 2^8: amax = m * 2^(e - 127) needs 2^(e - 135) when m <= 1.75, else 2^(e - 134).
  const int k = e - 135 + ((u & 0x7fffffu) > 0x600000u ? 1 : 0);
  return k >= -126 ? fmt::bits_to_float(uint32_t(k + 127) << 23) : fmt::bits_to_float(1u << (k + 149));
}

// The range of the row exponent E (the multiplier's exponent field
// (d >> 3) + 123 - E stays a normal BF16 one for every d, and 2^E a normal float).
constexpr int kFp8RowExponentMin = -100;
constexpr int kFp8RowExponentMax = 100;

// M'(d) of a row with exponent E in both halves of a BF16x2 word: the bias
// word of the row, then one multiply-add per multiplier byte as M(d).
NVFP4_HD uint32_t fp8_row_bias_bf16x2(int row_exponent) {
  return (uint32_t(123 - row_exponent) << 7) * 0x00010001u;
}

// Two BF16 values X (lanes h0, h1) and Y, each A * 2^-120 for an E4M3 value
// A -> the four E4M3 bytes (X.h0, X.h1, Y.h0, Y.h1): magnitude bits 10..4,
// the sign from bit 15. Host twin of the kernel's two permutes.
NVFP4_HD uint32_t fp8_pack_ref(uint32_t x, uint32_t y) {
  const uint32_t h[4] = {x & 0xffffu, x >> 16, y & 0xffffu, y >> 16};
  uint32_t out = 0;
  for (int i = 0; i < 4; ++i) out |= (((h[i] >> 4) & 0x7fu) | ((h[i] >> 8) & 0x80u)) << (8 * i);
  return out;
}

// One expert's projection -> E of each row in fragment order ([m_tiles][16],
// fragment_layout.hpp's rows; int8). mx_factors: the MXFP4 row groups'
// factors that encode_weight_scales gave (ignored for NVFP4). False, with the
// reason in *why, when a row's weights are not E4M3 values times a power of
// two (or its exponent leaves the range above).
bool fp8_weight_rows(const LinearExpertProjection& w, const float* mx_factors, int8_t* rows, std::string* why);

// Scalar reference of the operand conversion: BF16 rows [rows, ld_in]
// (logical order, `cols` live) -> E4M3 bytes [rows, ld_out] in operand
// order and scales [rows, cols / 128]; a block holding NaN gets the scale
// NaN and every byte 0x7F. The kernel (kernels/fp8_operand.hpp) writes the
// same bytes.
void fp8_operand_rows_ref(const uint16_t* bf16, int64_t rows, int64_t cols, int64_t ld_in, uint8_t* codes,
                          int64_t ld_out, float* scales);

}  // namespace nvfp4moe::cuda
