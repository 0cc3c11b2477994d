// Inner loops of the CPU MoE: NVFP4 weight-tile dequantization, FP32 dot
// products, SwiGLU. The scalar `*_ref` versions here are the definition; the
// versions without the suffix (cpu_kernels.cpp) pick AVX-512 / AVX2 code at
// run time and are tested against them (dequantization bit for bit; dots to
// FP32 rounding, since the SIMD versions use FMA and another summation order).
#pragma once

#include <cmath>
#include <cstdint>

#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/types.hpp"

namespace nvfp4moe::cpu {

// value(code) of both nibbles of every byte: pair[b] = {low, high}, and the
// value of every UE4M3 scale byte. Built from the one codec
// (src/format/nvfp4_codec.hpp), not a second one.
struct E2m1PairTable {
  float pair[256][2];
  float e2m1[16];
  float e4m3[256];
  E2m1PairTable() {
    for (int b = 0; b < 256; ++b) {
      pair[b][0] = fmt::e2m1_value(uint8_t(b & 15));
      pair[b][1] = fmt::e2m1_value(uint8_t(b >> 4));
      e4m3[b] = fmt::e4m3_value(uint8_t(b));
    }
    for (int c = 0; c < 16; ++c) e2m1[c] = fmt::e2m1_value(uint8_t(c));
  }
};

// Rows [0, n) of an NVFP4 matrix with K columns (codes [*, K/2], linear scales
// [*, K/16]) -> out [n, K] as value(q) * f32(s), WITHOUT the global scale: the
// product of a 4-bit and an 8-bit float is exact in FP32, so this is the exact
// dequantization up to the factor g that the GEMM applies on the sum.
inline void dequant_rows_noglobal_ref(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales,
                                  int64_t n, int64_t K, float* out) {
  const int64_t kb = K / fmt::kBlock;
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t b = 0; b < kb; ++b) {
      const float s = lut.e4m3[scales[r * kb + b]];
      const uint8_t* c = codes + r * (K / 2) + b * 8;
      float* o = out + r * K + b * 16;
      for (int i = 0; i < 8; ++i) {
        o[2 * i] = lut.pair[c[i]][0] * s;
        o[2 * i + 1] = lut.pair[c[i]][1] * s;
      }
    }
  }
}

// Rows [0, n) of an MXFP4 matrix with K columns (codes [*, K/2], UE8M0 scales
// [*, K/32]) -> out [n, K] as value(q) * 2^(b - 127), exact. MXFP4 has no
// global scale, so this is the whole dequantization: the routed experts'
// tile of more than kDotTokens tokens, and the definition the fused
// mxfp4_dot_rows_tokens equals.
inline void dequant_mxfp4_rows_ref(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n,
                                   int64_t K, float* out) {
  const int64_t kb = K / fmt::kMxBlock;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const float s = fmt::ue8m0_value(scales[r * kb + b]);
      const uint8_t* c = codes + r * (K / 2) + b * (fmt::kMxBlock / 2);
      float* o = out + r * K + b * fmt::kMxBlock;
      for (int i = 0; i < fmt::kMxBlock / 2; ++i) {
        o[2 * i] = lut.pair[c[i]][0] * s;
        o[2 * i + 1] = lut.pair[c[i]][1] * s;
      }
    }
}

// BF16 -> FP32 (exact widening).
inline void widen_bf16_ref(const Bf16* w, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(w[i]);
}

// One row of a block-scaled FP8 matrix (E4M3 bytes [K], the tile scales of
// the row's 128-row band [ceil(K / 128)]) -> out [K] = e4m3(b) * scale, one
// FP32 product per element: the exact dequantization of the format.
inline void widen_fp8_row_ref(const E2m1PairTable& lut, const uint8_t* w, const float* tile_scales, int64_t K,
                              float* out) {
  for (int64_t k = 0; k < K; ++k) out[k] = lut.e4m3[w[k]] * tile_scales[k / 128];
}

// dot of a with 4 rows w[0..3] (row stride K), K a multiple of 16, FP32
// accumulation in 16 independent lanes per row, summed pairwise at the end.
inline void dot_4rows_ref(const float* a, const float* w, int64_t K, float out[4]) {
  float acc[4][16] = {};
  for (int64_t k = 0; k < K; k += 16) {
    for (int r = 0; r < 4; ++r) {
      const float* wr = w + r * K + k;
      for (int l = 0; l < 16; ++l) acc[r][l] += a[k + l] * wr[l];
    }
  }
  for (int r = 0; r < 4; ++r) {
    for (int h = 8; h >= 1; h /= 2)
      for (int l = 0; l < h; ++l) acc[r][l] += acc[r][l + h];
    out[r] = acc[r][0];
  }
}

inline float dot_row_ref(const float* a, const float* w, int64_t K) {
  float acc[16] = {};
  for (int64_t k = 0; k < K; k += 16)
    for (int l = 0; l < 16; ++l) acc[l] += a[k + l] * w[k + l];
  for (int h = 8; h >= 1; h /= 2)
    for (int l = 0; l < h; ++l) acc[l] += acc[l + h];
  return acc[0];
}

// out[n] = dot(a, w row n) for n in [0, rows), rows of stride K.
inline void dot_rows_ref(const float* a, const float* w, int64_t rows, int64_t K, float* out) {
  int64_t n = 0;
  for (; n + 4 <= rows; n += 4) dot_4rows_ref(a, w + n * K, K, out + n);
  for (; n < rows; ++n) out[n] = dot_row_ref(a, w + n * K, K);
}

// Up to kDotTokens tokens against the same weight rows (the weight tile is
// read once for all of them): out[t * ldo + r] = dot(a[t], w row r).
// Each token's result is bit-identical to dot_rows on that token alone, so
// results never depend on how tokens were grouped.
constexpr int kDotTokens = 4;
inline void dot_rows_tokens_ref(const float* const* a, int m, const float* w, int64_t rows, int64_t K, float* out,
                                int64_t ldo) {
  for (int t = 0; t < m; ++t) dot_rows_ref(a[t], w, rows, K, out + t * ldo);
}

// The run-time-dispatched versions (cpu_kernels.cpp): same contracts. Each
// runs the code of the best ISA the CPU has, or (overloads taking a CpuIsa)
// of a given one, so that tests run every one the CPU has; where a kernel
// has no code for that ISA it takes the next lower one. Dots of different
// ISAs sum in different orders (AVX-512 16 lanes, AVX2 8).
enum class CpuIsa : uint8_t { Scalar, Avx2, Avx512 };
bool cpu_isa_available(CpuIsa isa);
CpuIsa cpu_isa_best();
const char* cpu_isa_name(CpuIsa isa);
// The best ISA's name ("avx512", "avx2", "scalar").
const char* cpu_kernel_isa();

void dot_rows_tokens(const float* const* a, int m, const float* w, int64_t rows, int64_t K, float* out,
                     int64_t ldo);
void dequant_rows_noglobal(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n,
                           int64_t K, float* out);
void dequant_mxfp4_rows(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t K,
                        float* out);
void dot_rows(const float* a, const float* w, int64_t rows, int64_t K, float* out);
void widen_bf16(const Bf16* w, int64_t n, float* out);
void dot_rows_tokens(CpuIsa isa, const float* const* a, int m, const float* w, int64_t rows, int64_t K, float* out,
                     int64_t ldo);
void dequant_rows_noglobal(CpuIsa isa, const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales,
                           int64_t n, int64_t K, float* out);
void dequant_mxfp4_rows(CpuIsa isa, const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n,
                        int64_t K, float* out);
void dot_rows(CpuIsa isa, const float* a, const float* w, int64_t rows, int64_t K, float* out);
void widen_bf16(CpuIsa isa, const Bf16* w, int64_t n, float* out);
void widen_fp8_row(const E2m1PairTable& lut, const uint8_t* w, const float* tile_scales, int64_t K, float* out);
void widen_fp8_row(CpuIsa isa, const E2m1PairTable& lut, const uint8_t* w, const float* tile_scales, int64_t K,
                   float* out);

// Dequantization fused into the dots, for groups of at most kDotTokens
// tokens (decode): out[t * ldo + r] = dot(a[t], W row r) with W rows [0, n)
// of an NVFP4 matrix with K columns, dequantized as value(q) * f32(s):
// AVX-512 inside the dots, no tile stored; AVX2 decodes the codes once into
// `scratch` (n * K floats) as int8 twice-values with one factor per block,
// a quarter of an FP32 tile's bytes, and widens them in the dots; the
// scalar fallback dequantizes into `scratch` and dots. Bit-identical to
// dequant_rows_noglobal followed by dot_rows_tokens of the same ISA (same
// products, same FMA order).
void nvfp4_dot_rows_tokens(const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch);
void nvfp4_dot_rows_tokens(CpuIsa isa, const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch);
// The same for MXFP4 rows (UE8M0 scales [n, K/32], K a multiple of 32):
// bit-identical to dequant_mxfp4_rows followed by dot_rows_tokens of the
// same ISA, `scratch` as above (AVX-512 dequantizes into it and dots).
void mxfp4_dot_rows_tokens(const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch);
void mxfp4_dot_rows_tokens(CpuIsa isa, const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch);

// The same for BF16 weight rows (the shared expert in decode): widening fused
// into the dots, bit-identical to widen_bf16 followed by dot_rows_tokens of
// the same ISA.
void bf16_dot_rows_tokens(const float* const* a, int m, const Bf16* w, int64_t n, int64_t K, float* out,
                          int64_t ldo, float* scratch);
void bf16_dot_rows_tokens(CpuIsa isa, const float* const* a, int m, const Bf16* w, int64_t n, int64_t K, float* out,
                          int64_t ldo, float* scratch);

// h = silu(min(gate, L)) * clamp(up, -L, L), silu(z) = z / (1 + exp(-z)).
// No limit (has_limit false): silu(gate) * up. NaN propagates.
inline float swiglu(float gate, float up, bool has_limit, float limit) {
  if (has_limit) {
    gate = gate > limit ? limit : gate;  // min(gate, L), keeping NaN
    up = up > limit ? limit : (up < -limit ? -limit : up);
  }
  return gate / (1.0f + std::exp(-gate)) * up;
}

}  // namespace nvfp4moe::cpu
