// NVFP4 block format and codecs — one header compiled by the CPU backend and
// by CUDA kernels, so that both produce the same bytes (docs/numerics.md §1-2).
//
// Conventions, here where bytes are produced and read:
//   * E2M1 code: 4 bits, SIGN-MAGNITUDE. Bit 3 = sign, bits 2..0 = index m into
//     {0, 0.5, 1, 1.5, 2, 3, 4, 6}. Never clamp a code to 0..15 or treat it as
//     an integer: that destroys the sign.
//   * Packing: element 2i of a row in the LOW nibble, 2i+1 in the HIGH nibble.
//   * UE4M3 block scale: one byte per 16 elements, an FP8 E4M3 BIT PATTERN
//     (0x3F is 1.875, not 63). Reinterpret, never numerically cast.
//   * The block scale is NVIDIA ModelOpt's (NVFP4QTensor): t_b = amax_b /
//     f32(6 * g) — the dequant factor amax_b/6 in units of the global scale
//     g, NOT amax_b — then 1 for an all-zero block, clamped to [2^-9, 448]
//     and rounded to E4M3. g = amax/(6*448) in the dequant direction.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define NVFP4_HD __host__ __device__ __forceinline__
#else
#define NVFP4_HD inline
#endif
#if defined(__CUDA_ARCH__)  // the device pass; host compilers do not know the pragma
#define NVFP4_UNROLL _Pragma("unroll")
#else
#define NVFP4_UNROLL
#endif

namespace nvfp4moe::fmt {

constexpr int kBlock = 16;            // elements per block scale
constexpr float kE2M1Max = 6.0f;      // largest E2M1 magnitude
constexpr float kE4M3Max = 448.0f;    // largest finite E4M3 value
constexpr float kGlobalDenom = 2688.0f;  // 6 * 448, exact in FP32
constexpr float kE4M3MinSubnormal = 0x1p-9f;  // smallest positive E4M3 value (byte 0x01)
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

// Value of a 4-bit E2M1 code (only the low 4 bits are read): magnitudes
// {0, 0.5, 1, 1.5, 2, 3, 4, 6}. As bits: codes 2..7 are 2^(e-1)(1 + m/2), the
// FP32 with exponent e + 126 and mantissa bit m, i.e. (c << 22) + 0x3F000000;
// 0.5 and 0 are the subnormal codes. Branch-free: the staging kernels call it
// per element.
NVFP4_HD float e2m1_value(uint8_t code) {
  const uint32_t c = code & 7u;
  const uint32_t mag = c >= 2u ? (c << 22) + 0x3f000000u : c * 0x3f000000u;
  return bits_to_float(mag | (uint32_t(code & 8u) << 28));
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
// infinity, and an infinite activation must propagate, docs/numerics.md §1).
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
#if defined(__CUDA_ARCH__)
  float r;  // one instruction (sm_80+); NaN-ness as below, the NaN's payload may differ
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(fabsf(x)));
  return r;
#else
  float ax = x < 0.0f ? -x : x;
  return (ax > a || ax != ax) ? ax : a;
#endif
}

// IEEE FP32 operations that the compiler must not contract or reorder: the
// block scale's order of operations is the contract (docs/numerics.md §2),
// and the fast paths below depend on each rounding.
NVFP4_HD float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);  // never contracted into an FMA
#else
  return a * b;
#endif
}

NVFP4_HD float fma_rn(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return __builtin_fmaf(a, b, c);
#endif
}

// RN(1 / d), correctly rounded.
NVFP4_HD float reciprocal_rn(float d) {
#if defined(__CUDA_ARCH__)
  return __frcp_rn(d);
#else
  return 1.0f / d;
#endif
}

// ---- The block scale (docs/numerics.md §2, NVIDIA ModelOpt's NVFP4QTensor) ----
//   t_b = amax_b / f32(6 * g)      6 * g rounded to FP32 first, then ONE division
//   t_b = (t_b == 0) ? 1 : t_b     an all-zero block gets scale 1.0 (byte 0x38)
//   s_b = e4m3(clamp(t_b, 2^-9, 448))
//   d_b = f32(s_b) * g
// Not (amax_b / 6) / g: that rounds twice and gives other bytes near E4M3
// rounding boundaries (an example in tests/format/test_quantize.cpp).

// clamp(t, 2^-9, 448) with NaN kept (both compares false): the clamp keeps a
// tiny block's scale off E4M3 zero (which would make d_b = 0) and a large
// one's at the largest finite E4M3 (a static g can put t above 448).
NVFP4_HD float clamp_block_scale(float t) {
  return t < kE4M3MinSubnormal ? kE4M3MinSubnormal : (t > kE4M3Max ? kE4M3Max : t);
}

// The block scale byte for a block with max |x| = amax_b under global scale
// g, the formula above with IEEE division: the scalar reference of every
// block scale. NaN marks: a non-finite g (a token holding NaN/Inf under a
// dynamic scale) gives NaN (0x7F) in every block of the scope, a non-finite
// amax_b (a NaN or Inf element under a static g) gives NaN in its block —
// never a clamped 448 for an Inf. (t is NaN otherwise only for g == 0, an
// amax below 2688 * 2^-150: IEEE's 0/0, byte 0x7F.)
NVFP4_HD uint8_t block_scale_byte(float amax_b, float g) {
  if (!is_finite(g) || !is_finite(amax_b)) return kE4M3NaN;
  float t = amax_b / mul_rn(kE2M1Max, g);  // f32(6 * g) first, then one division
  t = t == 0.0f ? 1.0f : t;
  return e4m3_from_float(clamp_block_scale(t));
}

// The block's dequant factor d_b = f32(s_b) * g.
NVFP4_HD float block_dequant_factor(uint8_t scale_byte, float g) { return e4m3_value(scale_byte) * g; }

// Code of element x under dequant factor d: e2m1(x / d), an IEEE division.
// (d is 0 only when f32(s_b) * g underflows; x / 0 then gives code 7 or 15,
// and 0 / 0 code 0, as the formula says.)
NVFP4_HD uint8_t quantize_element(float x, float d) { return e2m1_from_float(x / d); }

// ---- The fast exact paths (the CUDA staging kernels) ----
// Same bytes as block_scale_byte and quantize_element without an IEEE
// division: a reciprocal per row (block scale) or block (elements), then per
// quotient a multiply and two Newton corrections (FMA), and an integer E2M1
// encode. Tested against the IEEE versions on the CPU
// (tests/format/test_fast_quantize.cpp) and the GPU
// (tests/cuda/kernels/test_block_scale.cu); the host and device share them.

// The domain where quotient_rn(x, d, reciprocal_rn(d)) == x / d: a finite
// block (amax_b) whose dequant factor d and quotients stay well inside the
// normal range (block check), and elements that are 0 or not tiny (element
// check). Outside it (zero, subnormal or huge d, NaN/Inf blocks, elements
// below 2^-60) the caller takes quantize_element.
NVFP4_HD bool fast_quotient_block_ok(float amax_b, float d) {
  return d >= 0x1p-60f && d <= 0x1p60f && amax_b <= d * 0x1p60f;  // false for NaN amax_b; Inf fails the last
}
NVFP4_HD bool fast_quotient_element_ok(float x) {
  const uint32_t a = float_to_bits(x) & 0x7fffffffu;
  return a - 1u >= 0x21800000u - 1u;  // a == 0 (wraps to the top) or |x| >= 2^-60 (0x21800000)
}

// fast_quotient_element_ok for the two BF16 values of a word, given their
// magnitudes m = word & 0x7fff7fff: bit 15 of each half is set where that
// value FAILS it (nonzero and below 2^-60, BF16 bits 0x2180). Two adds and
// one logic op per pair instead of three ops per value: h + 0x7fff reaches
// bit 15 iff h != 0, h + 0x5e80 iff h >= 0x2180, and neither sum carries
// into the other half (h <= 0x7fff).
NVFP4_HD uint32_t bf16x2_outside_quotient_domain(uint32_t m) {
  return (m + 0x7fff7fffu) & ~(m + 0x5e805e80u) & 0x80008000u;
}

// RN(x / d) given y = RN(1 / d), inside the domain above. q = RN(x*y) is
// within 1.5 ulp of x/d, not always faithful; one Newton step (r = x - d*q
// exact enough, q += r*y) makes it faithful (< 1 ulp); with a faithful q and
// y = RN(1/d), Markstein's theorem makes the second step's residual exact
// and its result RN(x/d). Tested against IEEE division on every dividend
// significand for 2^16 divisors, and on all 2^46 significand pairs
// (tests/cuda/kernels/test_block_scale.cu).
// NOTES: one correction (return after the first step) is exact too: no
// theorem covers it (its q is not always faithful), but on an H200 it gave
// IEEE division's result on all 2^46 significand pairs, which covers every
// exponent inside the domain (scaling x or d by a power of two scales every
// intermediate exactly). It is not used: in the staging kernels' element
// quotients it measured slower (sm90_nvfp4_stage's operand path, 8192 rows
// of K=7168 BF16: 86 us against 79 us; sm90_nvfp4_requant, 49152 rows of
// K=3072: 292 against 275 us), and for the block scale, one quotient per 16
// values, no faster.
NVFP4_HD float quotient_rn(float x, float d, float y) {
  float q = mul_rn(x, y);
  float r = fma_rn(-d, q, x);
  q = fma_rn(r, y, q);
  r = fma_rn(-d, q, x);
  return fma_rn(r, y, q);
}

// What the fast block scale of a scope needs, computed once per row (or
// static scope): g, the divisor f32(6 * g) and its reciprocal.
struct BlockScaleDivisor {
  float g;   // the scope's global scale
  float d6;  // f32(6 * g), as block_scale_byte rounds it
  float r6;  // reciprocal_rn(d6)
};
NVFP4_HD BlockScaleDivisor block_scale_divisor(float g) {
  const float d6 = mul_rn(kE2M1Max, g);
  return {g, d6, reciprocal_rn(d6)};
}

// The E4M3 input of block_scale_byte, clamp(t_b), without its IEEE division:
// t_b = RN(amax_b / f32(6 g)) by quotient_rn, then 1 for t_b == 0 and the
// lower clamp. The upper clamp is left to the conversion: e4m3_from_float and
// the hardware's satfinite conversion both saturate finite values at 448.
// Returns false, leaving v alone, where amax_b or the divisor is outside
// quotient_rn's domain (NaN, Inf, tiny or huge: the caller then takes
// block_scale_byte); a NaN or Inf g always falls back. Inside it t_b >= 2^-120,
// so t_b == 0 exactly when amax_b == 0.
NVFP4_HD bool block_scale_quotient(float amax_b, const BlockScaleDivisor& s, float& v) {
  if (!fast_quotient_block_ok(amax_b, s.d6) || !fast_quotient_element_ok(amax_b)) return false;
  const float t = quotient_rn(amax_b, s.d6, s.r6);
  v = t == 0.0f ? 1.0f : fmaxf(t, kE4M3MinSubnormal);
  return true;
}

// The FP32 magnitude bits a rounded half to even at mantissa bit 22 (one
// mantissa bit kept; the low 22 bits are garbage): E2M1's grid for |v| >= 1.
NVFP4_HD uint32_t round_to_one_mantissa_bit(uint32_t a) { return a + 0x1fffffu + ((a >> 22) & 1u); }

// e2m1_from_float for a finite v with integer operations instead of seven
// compares. |v| >= 1: keep one mantissa bit, rounding half to even on the
// FP32 bits, code = 2 * (exponent + 1) + bit, saturating at 7; |v| < 1: the
// grid is 0.5, code = RN(2|v|), computed exactly as 2|v| + 2^23.
NVFP4_HD uint8_t e2m1_from_finite(float v) {
  const uint32_t a = float_to_bits(v) & 0x7fffffffu;
  const uint32_t above_one = (round_to_one_mantissa_bit(a) >> 22) - 252u;
  const uint32_t below_one = float_to_bits(bits_to_float(a) * 2.0f + 8388608.0f) - 0x4b000000u;
  uint32_t m = a < 0x3f800000u ? below_one : (above_one < 7u ? above_one : 7u);
  return uint8_t(m | (v < 0.0f ? 8u : 0u));
}

// value(e2m1_from_finite(v)) without forming the code (same rounding, same
// sign rule: -0 for tiny negatives, +0 for -0). E2M1's grid is 0.5 below 2,
// 1 in [2, 4) and 2 in [4, 8): adding and subtracting 2^22 * c (c the
// power of two of max(|v|, 1)'s binade) rounds |v| to that grid, half to
// even, in FP32 — the even grid point is the even code. |v| is first capped
// at 6, the largest value: 6 is on the grid of [4, 8), so (5, 6] still ends
// at 6 and 5 at the even 4, and c stays small. 7 operations instead of ~13.
NVFP4_HD float e2m1_round_magnitude(float v) {
  const float a = fminf(fabsf(v), kE2M1Max);
  const float c = bits_to_float(float_to_bits(fmaxf(a, 1.0f)) & 0x7f800000u);
  return fma_rn(c, -0x1p22f, fma_rn(c, 0x1p22f, a));  // both products exact, one rounding each
}

NVFP4_HD float e2m1_round_finite(float v) {
  const float r = e2m1_round_magnitude(v);
  return v < 0.0f ? -r : r;  // not the sign bit: -0 gives +0
}

// e2m1_round_finite of a quotient_rn result, which is never -0 (its FMA
// steps turn x = -0 into +0: (+0) + (-0) rounds to +0), so the sign is the
// sign bit — one logic op instead of a compare and a select per value.
NVFP4_HD float e2m1_round_quotient(float q) {
  return bits_to_float(float_to_bits(e2m1_round_magnitude(q)) | (float_to_bits(q) & 0x80000000u));
}

// Whether every element of a block passes fast_quotient_element_ok.
NVFP4_HD bool block_in_quotient_domain(const float (&x)[kBlock]) {
  bool ok = true;
  NVFP4_UNROLL
  for (int i = 0; i < kBlock; ++i) ok = ok && fast_quotient_element_ok(x[i]);
  return ok;
}

// The fast path over one block whose elements are in quotient_rn's domain
// (block_in_quotient_domain, or the caller's cheaper check): out(i, RN(x_i /
// d)) for its 16 elements, in order. Returns false, without calls, when the
// block itself is outside the domain: the caller then takes quantize_element.
template <typename Out>
NVFP4_HD bool quantize_block_fast(const float (&x)[kBlock], float amax_b, float d, Out out) {
  if (!fast_quotient_block_ok(amax_b, d)) return false;
  const float y = reciprocal_rn(d);
  NVFP4_UNROLL  // unrolled: indexing x or the outputs at run time would put them in local memory
  for (int i = 0; i < kBlock; ++i) out(i, quotient_rn(x[i], d, y));
  return true;
}

// The 16 codes of a block with max |x| = amax_b and dequant factor d, as
// quantize_element gives them, packed as stored (element i in nibble i % 8 of
// word i / 8).
NVFP4_HD void quantize_block_codes(const float (&x)[kBlock], float amax_b, float d, uint32_t (&codes)[2]) {
  codes[0] = codes[1] = 0;
  if (block_in_quotient_domain(x) &&
      quantize_block_fast(x, amax_b, d,
                          [&](int i, float q) { codes[i / 8] |= uint32_t(e2m1_from_finite(q)) << (4 * (i % 8)); }))
    return;
  NVFP4_UNROLL
  for (int i = 0; i < kBlock; ++i) codes[i / 8] |= uint32_t(quantize_element(x[i], d)) << (4 * (i % 8));
}

// The block's dequantized values value(q_i) * sv (sv = f32(s_b)), as
// quantize_element and e2m1_value give them, for callers that need the
// QDQ values and not the codes (the GEMM operand rows).
// elements_ok: whether every x_i passes fast_quotient_element_ok, when the
// caller knows it more cheaply (the staging kernels: bf16x2_outside_quotient_domain).
NVFP4_HD void quantize_block_values(const float (&x)[kBlock], bool elements_ok, float amax_b, float d, float sv,
                                    float (&out)[kBlock]) {
  if (elements_ok &&
      quantize_block_fast(x, amax_b, d, [&](int i, float q) { out[i] = e2m1_round_quotient(q) * sv; }))
    return;
  NVFP4_UNROLL
  for (int i = 0; i < kBlock; ++i) out[i] = e2m1_value(quantize_element(x[i], d)) * sv;
}

NVFP4_HD void quantize_block_values(const float (&x)[kBlock], float amax_b, float d, float sv, float (&out)[kBlock]) {
  quantize_block_values(x, block_in_quotient_domain(x), amax_b, d, sv, out);
}

}  // namespace nvfp4moe::fmt
