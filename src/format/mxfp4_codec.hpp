// MXFP4 block format and DeepSeek's FP8 activation quantizer — one header for
// C++ and CUDA, next to nvfp4_codec.hpp (docs/numerics.md §7).
//
// Conventions, here where bytes are read and produced:
//   * Codes: E2M1, sign-magnitude, packed as NVFP4's (element 2i in the LOW
//     nibble). DeepSeek-V4's inference/convert.py (`cast_e2m1fn_to_e4m3fn`)
//     unpacks the official experts as `low = x & 0x0F` (element 2i) and
//     `high = x >> 4` (element 2i+1) into a sign-magnitude table.
//   * Scale: one UE8M0 byte b per 32 consecutive elements of a row, the value
//     2^(b - 127); 0xFF is NaN (an error in weights), 0x00 is 2^-127. Scale
//     bytes are BIT PATTERNS (torch float8_e8m0fnu and uint8 hold the same
//     bytes); reinterpret, never cast numerically.
//   * Dequantization: value(q) * 2^(b - 127), exact in FP32 and in BF16
//     (at most 3 significant bits, exponent within BF16's range; the one
//     exception, 6 * 2^127, overflows both and is refused at load).
//   * FP8 activations for MXFP4 experts, as DeepSeek-V4's inference code
//     (`act_quant` in inference/kernel.py, called by `linear` in
//     inference/model.py with block_size 128 and scale_fmt "ue8m0"): per block
//     of 128 consecutive values, s = 2^ceil(log2(f32(max(amax, 1e-4) *
//     f32(1/448)))), q = e4m3(clamp(x / s, -448, 448)).
#pragma once

#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::fmt {

constexpr int kMxBlock = 32;          // elements per UE8M0 scale
constexpr uint8_t kUe8m0NaN = 0xFF;   // the one NaN byte of UE8M0

// 2^(b - 127) for b in 0..254, NaN for 0xFF. b = 0 is the FP32 subnormal 2^-127.
NVFP4_HD float ue8m0_value(uint8_t b) {
  if (b == kUe8m0NaN) return bits_to_float(0x7fc00000u);
  return b == 0 ? bits_to_float(0x00400000u) : bits_to_float(uint32_t(b) << 23);
}

// One MXFP4 element: value(code) * 2^(b - 127), one exact FP32 product.
NVFP4_HD float mxfp4_value(uint8_t code, uint8_t scale_byte) { return e2m1_value(code) * ue8m0_value(scale_byte); }

// ---- MXFP4 -> NVFP4 keeping the codes (ModelOpt's cast_mxfp4_to_nvfp4) -------

// E4M3 holds 2^d exactly for d in [-9, 8] (the subnormal 2^-9 up to 256).
constexpr int kE4M3MinPow2 = -9, kE4M3MaxPow2 = 8;

// Under the NVFP4 global scale 2^m, a 16-block of the MX block with scale
// byte b keeps its codes when d = b - 127 - m is in [-9, 8]; then *e4m3 is
// the block scale 2^d (exact) and the result is true.
NVFP4_HD bool mx_block_scale_as_e4m3(uint8_t b, int m, uint8_t* e4m3) {
  const int d = int(b) - 127 - m;
  if (d < kE4M3MinPow2 || d > kE4M3MaxPow2) return false;
  *e4m3 = e4m3_from_float(bits_to_float(uint32_t(d + 127) << 23));
  return true;
}

// ---- DeepSeek's FP8 activation quantizer (act_quant, scale_fmt "ue8m0") ------

constexpr int kFp8ActBlock = 128;               // act_quant's block_size for FP4 experts
constexpr float kFp8ActAmaxFloor = 1e-4f;       // T.max(amax, 1e-4) before the scale
constexpr float kE4M3MaxInv = 1.0f / 448.0f;    // fp8_max_inv, rounded to FP32 (not exact)

// fast_round_scale: the smallest power of two >= t, read from t's bits:
// exponent field - 127, plus one when the mantissa is not zero.
NVFP4_HD float pow2_ceil_bits(float t) {
  const uint32_t u = float_to_bits(t);
  const int e = int((u >> 23) & 0xFFu) - 127 + ((u & 0x7FFFFFu) != 0 ? 1 : 0);
  return bits_to_float(uint32_t(e + 127) << 23);
}

// The block's FP32 scale from its amax: 2^ceil(log2(f32(max(amax, 1e-4) *
// f32(1/448)))), a product (not a division) as the kernel forms it. A NaN or
// infinite amax gives NaN (the block, hence its token, turns NaN; DeepSeek's
// kernel leaves that case undefined).
NVFP4_HD float fp8_act_block_scale(float amax) {
  if (!is_finite(amax)) return bits_to_float(0x7fc00000u);
  const float a = amax > kFp8ActAmaxFloor ? amax : kFp8ActAmaxFloor;
  return pow2_ceil_bits(a * kE4M3MaxInv);
}

// The E4M3 byte of x under block scale s: e4m3(clamp(x / s, -448, 448)). x / s
// is exact (s is a power of two) short of FP32 underflow, where IEEE rounding
// applies as in the kernel. A NaN quotient is the byte 0x7F whatever its sign
// bit: which operand's NaN an x86 division or multiplication passes on
// depends on the order the compiler puts them in, and the GPU's arithmetic
// returns its one canonical, positive NaN.
NVFP4_HD uint8_t fp8_act_byte(float v) {
  if (v != v) return kE4M3NaN;
  v = v > kE4M3Max ? kE4M3Max : (v < -kE4M3Max ? -kE4M3Max : v);
  return e4m3_from_float(v);
}
NVFP4_HD uint8_t fp8_act_code(float x, float s) { return fp8_act_byte(x / s); }

// fp8_act_code with the multiply by 1/s that the CUDA staging runs instead
// of the division: the same byte for every x. s is NaN or a power of two in
// [2^-23, 2^120] (amax >= 1e-4, amax <= the largest float), so 1/s is an exact
// normal float and x * (1/s) and x / s are one rounding of the same real
// number (tested against fp8_act_code).
NVFP4_HD float fp8_act_inverse_scale(float s) { return 1.0f / s; }
NVFP4_HD uint8_t fp8_act_code_by_inverse(float x, float inv_s) { return fp8_act_byte(x * inv_s); }

}  // namespace nvfp4moe::fmt
