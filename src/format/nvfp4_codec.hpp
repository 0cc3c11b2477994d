// NVFP4 block format and codecs — one header compiled by the CPU backend and
// by CUDA kernels, so that both produce the same bytes (spec sections 1-2).
//
// Conventions, here where bytes are produced and read:
//   * E2M1 code: 4 bits, SIGN-MAGNITUDE. Bit 3 = sign, bits 2..0 = index m into
//     {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Never clamp a code to 0..15 or treat it as
//     an integer: that destroys the sign.
//   * Packing: element 2i of a row in the LOW nibble, 2i+1 in the HIGH nibble.
//   * UE4M3 block scale: one byte per 16 elements, an FP8 E4M3 BIT PATTERN
//     (0x3F is 1.875, not 63). Reinterpret, never numerically cast.
//   * The block scale is the dequant factor block_amax/6 divided by the global
//     scale g, NOT block_amax. g = amax/(6*448) in the dequant direction.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif

namespace nvfp4moe::fmt {

constexpr int kBlock = 16;            // elements per block scale
constexpr float kE2M1Max = 6.0f;      // largest E2M1 magnitude
constexpr float kE4M3Max = 448.0f;    // largest finite E4M3 value
constexpr float kGlobalDenom = 2688.0f;  // 6 * 448, exact in FP32
constexpr uint8_t kE4M3NaN = 0x7F;    // scale byte of a block holding NaN/Inf
constexpr uint8_t kE4M3MaxByte = 0x7E;  // 448

// A 16-element block as stored: 8 bytes of packed codes and its scale byte.
struct Nvfp4Block {
  uint8_t codes[kBlock / 2];  // element 2i low nibble, 2i+1 high nibble
};
static_assert(sizeof(Nvfp4Block) == 8, "a block of 16 E2M1 codes packs into 8 bytes");

NVFP4_HD float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

NVFP4_HD uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

NVFP4_HD bool is_finite(float f) { return (float_to_bits(f) & 0x7f800000u) != 0x7f800000u; }

// Magnitude of E2M1 index m (0..7): {0, 0.5, 1, 1.5, 2, 3, 4, 6}.
NVFP4_HD float e2m1_magnitude(int m) {
  return m < 2 ? 0.5f * float(m) : float(2 + (m & 1)) * float(1 << (m >> 1)) * 0.25f;
}

// Value of a 4-bit E2M1 code (only the low 4 bits are read).
NVFP4_HD float e2m1_value(uint8_t code) {
  float mag = e2m1_magnitude(code & 7);
  return (code & 8) ? -mag : mag;
}

// Nearest E2M1 code of v: ties to the even index, saturating at 6, sign bit
// iff v < 0 (so -0.1 encodes as 0x8). NaN encodes as 0x0: the block's scale
// byte (0x7F) carries the NaN.
NVFP4_HD uint8_t e2m1_from_float(float v) {
  float a = v < 0.0f ? -v : v;
  int m = int(a > 0.25f) + int(a >= 0.75f) + int(a > 1.25f) + int(a >= 1.75f) +
          int(a > 2.5f) + int(a >= 3.5f) + int(a > 5.0f);
  return uint8_t(m | (v < 0.0f ? 8 : 0));
}

// Value of an E4M3 (float8_e4m3fn) bit pattern: bias 7, subnormals m * 2^-9,
// 0x7F/0xFF NaN, no infinities.
NVFP4_HD float e4m3_value(uint8_t b) {
  uint32_t e = (b >> 3) & 15u, m = b & 7u;
  float mag;
  if (e == 0) {
    mag = float(m) * (1.0f / 512.0f);
  } else if (e == 15 && m == 7) {
    mag = bits_to_float(0x7fc00000u);
  } else {
    mag = bits_to_float(((e + 120u) << 23) | (m << 20));
  }
  return (b & 0x80) ? -mag : mag;
}

// Nearest E4M3 bit pattern of v: round to nearest even, finite values beyond
// 448 saturate to 448 (0x7E); NaN and +-Inf give NaN (0x7F, E4M3 has no
// infinity, and an infinite activation must propagate, spec section 1).
NVFP4_HD uint8_t e4m3_from_float(float v) {
  uint32_t u = float_to_bits(v);
  uint8_t sign = uint8_t((u >> 24) & 0x80u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) return uint8_t(sign | kE4M3NaN);
  if (u >= 0x43e00000u) return uint8_t(sign | kE4M3MaxByte);  // >= 448
  uint32_t code;
  if (u >= 0x3c800000u) {  // >= 2^-6: normal in E4M3, keep 3 mantissa bits
    uint32_t r = u >> 20, rem = u & 0xfffffu;
    if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
    code = r - (120u << 3);  // rebias 127 -> 7
  } else {                   // subnormal: nearest multiple of 2^-9 (8 gives 2^-6)
    float s = bits_to_float(u) * 512.0f;  // exact: a power-of-two scaling
    uint32_t i = uint32_t(s);
    float frac = s - float(i);
    if (frac > 0.5f || (frac == 0.5f && (i & 1u))) ++i;
    code = i;
  }
  return uint8_t(sign | code);
}

// The global scale of a scope in the dequant direction: amax / (6*448), or 1
// when amax is 0. NaN/Inf amax give NaN/Inf (activations propagate them).
NVFP4_HD float global_scale_from_amax(float amax) {
  return amax == 0.0f ? 1.0f : amax / kGlobalDenom;
}

// max(a, |x|) that propagates NaN (fmaxf would drop it).
NVFP4_HD float abs_max_nan(float a, float x) {
  float ax = x < 0.0f ? -x : x;
  return (ax > a || ax != ax) ? ax : a;
}

// The block scale byte for a block with max |x| = amax_b under global scale g
// (spec section 2): e4m3((amax_b / 6) / g). A non-finite g (a token holding
// NaN/Inf under a dynamic scale) marks every block of the scope with NaN.
NVFP4_HD uint8_t block_scale_byte(float amax_b, float g) {
  if (!is_finite(g)) return kE4M3NaN;
  return e4m3_from_float((amax_b / kE2M1Max) / g);
}

// The block's dequant factor d_b = f32(s_b) * g.
NVFP4_HD float block_dequant_factor(uint8_t scale_byte, float g) { return e4m3_value(scale_byte) * g; }

// Code of element x under dequant factor d: 0 when d == 0, else e2m1(x / d).
NVFP4_HD uint8_t quantize_element(float x, float d) {
  return d == 0.0f ? uint8_t(0) : e2m1_from_float(x / d);
}

}  // namespace nvfp4moe::fmt
