// SIMD versions of the CPU MoE inner loops, chosen once per call by the CPU's
// features (the library is built for baseline x86-64; these functions carry
// their own target attributes). Contracts and scalar definitions:
// cpu_kernels.hpp.
//
// NOTES: dequantization of one 16-element block with AVX-512 is five
// instructions: split the 8 code bytes into 16 nibbles (and/shift/unpack),
// widen to 16 int32 lanes, look the 16 E2M1 values up with one vpermps from a
// register table, multiply by the block's UE4M3 value. value(q) * f32(s) is
// exact, so this is bit-identical to the scalar reference. AVX2 has no
// 16-entry permute: its FP32 tiles take 8 codes a register, two 8-entry
// permutes (the table's halves) and a blend on the code's top bit
// (E2m1Avx2); its fused dots decode the codes to int8 once with a byte
// shuffle per 16 codes (decode_int8_rows_avx2) and widen them in the loads.
//
// NOTES (AMD EPYC, Zen 3, one thread, a 4096 x 4096 matrix in 16-row tiles):
// against the scalar dequantization / widening followed by 8-lane dots, the
// AVX2 kernels took BF16 dots 4497 -> 2012 us at one token (memory-bound
// there: 16.7 GB/s) and 7878 -> 3262 at four, NVFP4 fused dots 9442 -> 4224
// at one and 11165 -> 5235 at four (before their int8 decode), NVFP4 tile
// dequantization 6134 -> 3631, MXFP4 11979 -> 3782.
#include <cstring>

#include "cpu/cpu_kernels.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's AVX-512 headers self-initialise undefined vectors (`__Y = __Y`)
// and warn about it where they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define NVFP4_CPU_X86 1
#endif

#include "cpu/e4m3_simd.hpp"

namespace nvfp4moe::cpu {

namespace {

#ifdef NVFP4_CPU_X86
bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return yes;
}
bool has_avx2() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return yes;
}

__attribute__((target("avx512f,avx512bw"))) void dequant_avx512(const E2m1PairTable& lut, const uint8_t* codes,
                                                                 const uint8_t* scales, int64_t n, int64_t K,
                                                                 float* out) {
  const __m512 table = _mm512_loadu_ps(lut.e2m1);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const int64_t kb = K / 16;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      uint64_t c8;
      std::memcpy(&c8, codes + r * (K / 2) + b * 8, 8);
      const __m128i bytes = _mm_cvtsi64_si128(int64_t(c8));
      const __m128i lo = _mm_and_si128(bytes, low4);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
      const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));  // element 2i low nibble
      const __m512 v = _mm512_permutexvar_ps(idx, table);
      _mm512_storeu_ps(out + r * K + b * 16, _mm512_mul_ps(v, _mm512_set1_ps(lut.e4m3[scales[r * kb + b]])));
    }
}

__attribute__((target("avx512f"))) void dot_rows_avx512(const float* a, const float* w, int64_t rows, int64_t K,
                                                        float* out) {
  int64_t n = 0;
  for (; n + 4 <= rows; n += 4) {
    const float* w0 = w + n * K;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    for (int64_t k = 0; k < K; k += 16) {
      const __m512 av = _mm512_loadu_ps(a + k);
      acc0 = _mm512_fmadd_ps(av, _mm512_loadu_ps(w0 + k), acc0);
      acc1 = _mm512_fmadd_ps(av, _mm512_loadu_ps(w0 + K + k), acc1);
      acc2 = _mm512_fmadd_ps(av, _mm512_loadu_ps(w0 + 2 * K + k), acc2);
      acc3 = _mm512_fmadd_ps(av, _mm512_loadu_ps(w0 + 3 * K + k), acc3);
    }
    out[n] = _mm512_reduce_add_ps(acc0);
    out[n + 1] = _mm512_reduce_add_ps(acc1);
    out[n + 2] = _mm512_reduce_add_ps(acc2);
    out[n + 3] = _mm512_reduce_add_ps(acc3);
  }
  for (; n < rows; ++n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + k), _mm512_loadu_ps(w + n * K + k), acc);
    out[n] = _mm512_reduce_add_ps(acc);
  }
}

// M tokens x 4 rows per pass: 4M accumulators, 4 + M loads per 4M FMAs.
// Per accumulator the operation sequence is that of dot_rows_avx512.
template <int M>
__attribute__((target("avx512f"))) void dot_tokens_avx512(const float* const* a, const float* w, int64_t rows,
                                                          int64_t K, float* out, int64_t ldo) {
  int64_t n = 0;
  for (; n + 4 <= rows; n += 4) {
    const float* w0 = w + n * K;
    __m512 acc[M][4];
    for (int t = 0; t < M; ++t)
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __m512 wv0 = _mm512_loadu_ps(w0 + k), wv1 = _mm512_loadu_ps(w0 + K + k);
      const __m512 wv2 = _mm512_loadu_ps(w0 + 2 * K + k), wv3 = _mm512_loadu_ps(w0 + 3 * K + k);
      for (int t = 0; t < M; ++t) {
        const __m512 av = _mm512_loadu_ps(a[t] + k);
        acc[t][0] = _mm512_fmadd_ps(av, wv0, acc[t][0]);
        acc[t][1] = _mm512_fmadd_ps(av, wv1, acc[t][1]);
        acc[t][2] = _mm512_fmadd_ps(av, wv2, acc[t][2]);
        acc[t][3] = _mm512_fmadd_ps(av, wv3, acc[t][3]);
      }
    }
    for (int t = 0; t < M; ++t)
      for (int r = 0; r < 4; ++r) out[t * ldo + n + r] = _mm512_reduce_add_ps(acc[t][r]);
  }
  if (n < rows)
    for (int t = 0; t < M; ++t) dot_rows_avx512(a[t], w + n * K, rows - n, K, out + t * ldo + n);
}

// 16 E2M1 codes (8 bytes) -> 16 floats value(q) * s (exact).
__attribute__((target("avx512f,avx512bw"))) inline __m512 decode16_avx512(const uint8_t* c, __m512 table, __m512 s) {
  uint64_t c8;
  std::memcpy(&c8, c, 8);
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const __m128i bytes = _mm_cvtsi64_si128(int64_t(c8));
  const __m128i lo = _mm_and_si128(bytes, low4);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
  return _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)), table), s);
}

// Fused: per 16-column block, decode 4 weight rows and FMA them with M tokens.
// Per accumulator the sequence equals dot_tokens_avx512 on the dequantized tile.
template <int M>
__attribute__((target("avx512f,avx512bw"))) void nvfp4_dot_avx512(const E2m1PairTable& lut, const float* const* a,
                                                                  const uint8_t* codes, const uint8_t* scales,
                                                                  int64_t n, int64_t K, float* out, int64_t ldo) {
  const __m512 table = _mm512_loadu_ps(lut.e2m1);
  const int64_t kb = K / 16;
  int64_t r0 = 0;
  for (; r0 + 4 <= n; r0 += 4) {
    __m512 acc[M][4];
    for (int t = 0; t < M; ++t)
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < kb; ++b) {
      __m512 wv[4];
      for (int r = 0; r < 4; ++r)
        wv[r] = decode16_avx512(codes + (r0 + r) * (K / 2) + b * 8, table,
                                _mm512_set1_ps(lut.e4m3[scales[(r0 + r) * kb + b]]));
      for (int t = 0; t < M; ++t) {
        const __m512 av = _mm512_loadu_ps(a[t] + b * 16);
        for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_fmadd_ps(av, wv[r], acc[t][r]);
      }
    }
    for (int t = 0; t < M; ++t)
      for (int r = 0; r < 4; ++r) out[t * ldo + r0 + r] = _mm512_reduce_add_ps(acc[t][r]);
  }
  for (; r0 < n; ++r0)  // single rows: the sequence of dot_rows_avx512's tail
    for (int t = 0; t < M; ++t) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t b = 0; b < kb; ++b)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a[t] + b * 16),
                              decode16_avx512(codes + r0 * (K / 2) + b * 8, table,
                                              _mm512_set1_ps(lut.e4m3[scales[r0 * kb + b]])),
                              acc);
      out[t * ldo + r0] = _mm512_reduce_add_ps(acc);
    }
}

__attribute__((target("avx512f"))) inline __m512 widen16_avx512(const Bf16* w) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Per accumulator the sequence of dot_tokens_avx512 on the widened rows.
template <int M>
__attribute__((target("avx512f"))) void bf16_dot_avx512(const float* const* a, const Bf16* w, int64_t n, int64_t K,
                                                        float* out, int64_t ldo) {
  int64_t r0 = 0;
  for (; r0 + 4 <= n; r0 += 4) {
    __m512 acc[M][4];
    for (int t = 0; t < M; ++t)
      for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      __m512 wv[4];
      for (int r = 0; r < 4; ++r) wv[r] = widen16_avx512(w + (r0 + r) * K + k);
      for (int t = 0; t < M; ++t) {
        const __m512 av = _mm512_loadu_ps(a[t] + k);
        for (int r = 0; r < 4; ++r) acc[t][r] = _mm512_fmadd_ps(av, wv[r], acc[t][r]);
      }
    }
    for (int t = 0; t < M; ++t)
      for (int r = 0; r < 4; ++r) out[t * ldo + r0 + r] = _mm512_reduce_add_ps(acc[t][r]);
  }
  for (; r0 < n; ++r0)
    for (int t = 0; t < M; ++t) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16)
        acc = _mm512_fmadd_ps(_mm512_loadu_ps(a[t] + k), widen16_avx512(w + r0 * K + k), acc);
      out[t * ldo + r0] = _mm512_reduce_add_ps(acc);
    }
}

#define NVFP4_AVX2 __attribute__((target("avx2,fma,f16c")))

NVFP4_AVX2 float hsum256(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

// 8 E2M1 codes (4 bytes, element 2i in the low nibble of byte i) -> their
// 8 table values times s (exact). The nibbles go to 8 int32 lanes by
// duplicating each byte and shifting every odd lane by 4; a code's low 3
// bits pick from the table's first or second half, its bit 3 (moved to the
// sign bit) blends between them, so the table is used as it stands.
struct E2m1Avx2 {
  __m256 lo, hi;
  NVFP4_AVX2 explicit E2m1Avx2(const E2m1PairTable& lut)
      : lo(_mm256_loadu_ps(lut.e2m1)), hi(_mm256_loadu_ps(lut.e2m1 + 8)) {}
  NVFP4_AVX2 __m256 decode8(const uint8_t* c, __m256 s) const {
    uint32_t c4;
    std::memcpy(&c4, c, 4);
    const __m128i b = _mm_cvtsi32_si128(int(c4));
    const __m256i v = _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    const __m256i q = _mm256_srlv_epi32(v, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    const __m256 sign = _mm256_castsi256_ps(_mm256_slli_epi32(q, 28));
    const __m256 val = _mm256_blendv_ps(_mm256_permutevar8x32_ps(lo, q), _mm256_permutevar8x32_ps(hi, q), sign);
    return _mm256_mul_ps(val, s);
  }
};

// Rows of 4-bit codes with one scale byte per kBlock elements (NVFP4: 16,
// UE4M3; MXFP4: 32, UE8M0), scale_of(byte) its exact float.
template <int kBlock, class ScaleOf>
NVFP4_AVX2 void dequant_blocks_avx2(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n,
                                    int64_t K, float* out, ScaleOf scale_of) {
  const E2m1Avx2 e2m1(lut);
  const int64_t kb = K / kBlock;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t b = 0; b < kb; ++b) {
      const __m256 s = _mm256_set1_ps(scale_of(scales[r * kb + b]));
      const uint8_t* c = codes + r * (K / 2) + b * (kBlock / 2);
      float* o = out + r * K + b * kBlock;
      for (int i = 0; i < kBlock / 8; ++i) _mm256_storeu_ps(o + 8 * i, e2m1.decode8(c + 4 * i, s));
    }
}

NVFP4_AVX2 void widen_avx2(const Bf16* w, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + i));
    _mm256_storeu_ps(out + i, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) out[i] = bf16_to_float(w[i]);
}

// E4M3 bytes x their tile scale (exact): 16 at a time as FP16 patterns of
// e4m3 / 256 (e4m3_simd.hpp), vcvtph2ps, an exact multiply by 256, and one
// multiply by the scale, which rounds as the reference does. 16 divides the
// 128-column tile, so a group has one scale.
NVFP4_AVX2 void widen_fp8_row_avx2(const E2m1PairTable& lut, const uint8_t* w, const float* tile_scales, int64_t K,
                                   float* out) {
  const __m256 x256 = _mm256_set1_ps(256.0f);
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k));
    const __m256i h = e4m3_half_patterns(_mm256_cvtepi8_epi16(b));
    const __m256 s = _mm256_set1_ps(tile_scales[k / 128]);
    const __m256 lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
    _mm256_storeu_ps(out + k, _mm256_mul_ps(_mm256_mul_ps(lo, x256), s));
    const __m256 hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
    _mm256_storeu_ps(out + k + 8, _mm256_mul_ps(_mm256_mul_ps(hi, x256), s));
  }
  for (; k < K; ++k) out[k] = lut.e4m3[w[k]] * tile_scales[k / 128];
}

// The AVX2 dots: per (token, row) one 8-lane FP32 accumulator, acc =
// fma(a[k..k+8), w[k..k+8), acc) for k = 0, 8, ..., then hsum256. Every
// grouping of tokens and rows below keeps that sequence per accumulator,
// so a token's result never depends on its group, and the fused versions
// equal "dequantize / widen, then dot" bit for bit. The weight rows come
// through a loader: FP32 rows, BF16 rows widened, or 4-bit rows decoded to int8.
struct Fp32RowsAvx2 {
  const float* w;
  int64_t K;
  NVFP4_AVX2 __m256 load(int64_t r, int64_t k) const { return _mm256_loadu_ps(w + r * K + k); }
};
struct Bf16RowsAvx2 {
  const Bf16* w;
  int64_t K;
  NVFP4_AVX2 __m256 load(int64_t r, int64_t k) const {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + r * K + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
};

// Rows of 4-bit codes decoded once (decode_int8_rows_avx2) into iw =
// 2 value(q) as int8 in element order, with one factor s / 2 per block of
// kBlock elements: load() widens 8 of them and multiplies, which is
// value(q) * s exactly (iw and s have at most 4 significant bits each). A
// zero weight may come out +0 where value(q) * s is -0; no FMA sum started
// at +0 tells them apart.
template <int kBlock>
struct Int8BlockRowsAvx2 {
  const int8_t* iw;   // [n, K]
  const float* half;  // [n, blocks]
  int64_t K, blocks;  // blocks = K / kBlock
  NVFP4_AVX2 __m256 load(int64_t r, int64_t k) const {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(iw + r * K + k));
    // set1 of the value, not _mm256_broadcast_ss of its address: with the
    // pointer form GCC 12 stored every accumulator of the pass at each step.
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                         _mm256_set1_ps(half[r * blocks + k / kBlock]));
  }
};

// Rows [0, n) of codes [n, K/2] (element 2i in the low nibble of byte i) ->
// iw [n, K] = 2 value(q) as int8 (a byte shuffle per 16 codes), and the
// block scale bytes [n, K / kBlock] -> half = scale_of(byte) / 2.
template <int kBlock, class ScaleOf>
NVFP4_AVX2 void decode_int8_rows_avx2(const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t K, int8_t* iw,
                                      float* half, ScaleOf scale_of) {
  alignas(16) static constexpr int8_t kTwiceValue[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  const __m128i table = _mm_load_si128(reinterpret_cast<const __m128i*>(kTwiceValue));
  const __m128i low4 = _mm_set1_epi8(0x0F);
  const int64_t elements = n * K;  // the rows' codes are one contiguous run
  int64_t e = 0;
  for (; e + 32 <= elements; e += 32) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + e / 2));
    const __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(b, low4));
    const __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(b, 4), low4));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(iw + e), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(iw + e + 16), _mm_unpackhi_epi8(lo, hi));
  }
  for (; e < elements; e += 2) {
    iw[e] = kTwiceValue[codes[e / 2] & 15];
    iw[e + 1] = kTwiceValue[codes[e / 2] >> 4];
  }
  for (int64_t b = 0; b < n * (K / kBlock); ++b) half[b] = scale_of(scales[b]) * 0.5f;
}

// M tokens x R rows from row r0.
template <int M, int R, class Rows>
NVFP4_AVX2 void dot_pass_avx2(const float* const* a, const Rows& rows, int64_t r0, int64_t K, float* out,
                               int64_t ldo) {
  const Rows w = rows;  // a local copy: its fields stay in registers across the loop
  __m256 acc[M][R];
  for (int t = 0; t < M; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; k += 8) {
    __m256 wv[R];
    for (int r = 0; r < R; ++r) wv[r] = w.load(r0 + r, k);
    for (int t = 0; t < M; ++t) {
      const __m256 av = _mm256_loadu_ps(a[t] + k);
      for (int r = 0; r < R; ++r) acc[t][r] = _mm256_fmadd_ps(av, wv[r], acc[t][r]);
    }
  }
  for (int t = 0; t < M; ++t)
    for (int r = 0; r < R; ++r) out[t * ldo + r0 + r] = hsum256(acc[t][r]);
}

// Rows [0, n) for M <= kDotTokens tokens: M x R <= 12 accumulators a pass
// (16 ymm registers hold them with the rows' values and one token's), then
// single rows.
// NOTES (Zen 3, one thread, 64 tokens in passes of 4 over a 16 x 4096 tile
// in L2, min of 300): 3 rows a pass at 3-4 tokens instead of 2 take 7 loads
// per 12 FMAs instead of 6 per 8; FP32 rows 161 -> 112-115 us, BF16 rows
// (widened in the loads) 151 -> 104-106, NVFP4 rows (then decoded in each
// load, which bound them) 293 either way.
template <int M, class Rows>
NVFP4_AVX2 void dot_tokens_avx2(const float* const* a, const Rows& w, int64_t n, int64_t K, float* out, int64_t ldo) {
  constexpr int R = M <= 2 ? 4 : 3;
  int64_t r0 = 0;
  for (; r0 + R <= n; r0 += R) dot_pass_avx2<M, R>(a, w, r0, K, out, ldo);
  for (; r0 < n; ++r0) dot_pass_avx2<M, 1>(a, w, r0, K, out, ldo);
}

template <class Rows>
NVFP4_AVX2 void dot_tokens_avx2(const float* const* a, int m, const Rows& w, int64_t n, int64_t K, float* out,
                                int64_t ldo) {
  switch (m) {
    case 1: return dot_tokens_avx2<1>(a, w, n, K, out, ldo);
    case 2: return dot_tokens_avx2<2>(a, w, n, K, out, ldo);
    case 3: return dot_tokens_avx2<3>(a, w, n, K, out, ldo);
    default: return dot_tokens_avx2<4>(a, w, n, K, out, ldo);
  }
}

__attribute__((target("avx512f"))) void widen_avx512(const Bf16* w, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i));
    _mm512_storeu_ps(out + i, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
  }
  for (; i < n; ++i) out[i] = bf16_to_float(w[i]);
}
#endif

}  // namespace

bool cpu_isa_available(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return true;
#ifdef NVFP4_CPU_X86
    case CpuIsa::Avx2: return has_avx2();
    case CpuIsa::Avx512: return has_avx512();
#endif
    default: return false;
  }
}

CpuIsa cpu_isa_best() {
  static const CpuIsa best = cpu_isa_available(CpuIsa::Avx512) ? CpuIsa::Avx512
                             : cpu_isa_available(CpuIsa::Avx2) ? CpuIsa::Avx2
                                                               : CpuIsa::Scalar;
  return best;
}

const char* cpu_isa_name(CpuIsa isa) {
  return isa == CpuIsa::Avx512 ? "avx512" : isa == CpuIsa::Avx2 ? "avx2" : "scalar";
}

const char* cpu_kernel_isa() { return cpu_isa_name(cpu_isa_best()); }

// Each kernel takes the code of `isa` where the CPU has it and that code
// exists, else the next lower one (AVX-512 machines have AVX2).
namespace {
#ifdef NVFP4_CPU_X86
bool use_avx512(CpuIsa isa) { return isa == CpuIsa::Avx512 && has_avx512(); }
bool use_avx2(CpuIsa isa) { return isa >= CpuIsa::Avx2 && has_avx2(); }
#endif
}  // namespace

void dequant_rows_noglobal(CpuIsa isa, const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales,
                           int64_t n, int64_t K, float* out) {
#ifdef NVFP4_CPU_X86
  if (use_avx512(isa)) return dequant_avx512(lut, codes, scales, n, K, out);
  if (use_avx2(isa))
    return dequant_blocks_avx2<16>(lut, codes, scales, n, K, out, [&](uint8_t b) { return lut.e4m3[b]; });
#endif
  dequant_rows_noglobal_ref(lut, codes, scales, n, K, out);
}

void dequant_mxfp4_rows(CpuIsa isa, const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n,
                        int64_t K, float* out) {
#ifdef NVFP4_CPU_X86
  if (use_avx2(isa))
    return dequant_blocks_avx2<fmt::kMxBlock>(lut, codes, scales, n, K, out, fmt::ue8m0_value);
#endif
  dequant_mxfp4_rows_ref(lut, codes, scales, n, K, out);
}

void dot_rows(CpuIsa isa, const float* a, const float* w, int64_t rows, int64_t K, float* out) {
#ifdef NVFP4_CPU_X86
  if (use_avx512(isa)) return dot_rows_avx512(a, w, rows, K, out);
  if (use_avx2(isa)) return dot_tokens_avx2<1>(&a, Fp32RowsAvx2{w, K}, rows, K, out, 0);
#endif
  dot_rows_ref(a, w, rows, K, out);
}

void widen_bf16(CpuIsa isa, const Bf16* w, int64_t n, float* out) {
#ifdef NVFP4_CPU_X86
  if (use_avx512(isa)) return widen_avx512(w, n, out);
  if (use_avx2(isa)) return widen_avx2(w, n, out);
#endif
  widen_bf16_ref(w, n, out);
}

void widen_fp8_row(CpuIsa isa, const E2m1PairTable& lut, const uint8_t* w, const float* tile_scales, int64_t K,
                   float* out) {
#ifdef NVFP4_CPU_X86
  if (use_avx2(isa)) return widen_fp8_row_avx2(lut, w, tile_scales, K, out);
#endif
  widen_fp8_row_ref(lut, w, tile_scales, K, out);
}

void dot_rows_tokens(CpuIsa isa, const float* const* a, int m, const float* w, int64_t rows, int64_t K, float* out,
                     int64_t ldo) {
#ifdef NVFP4_CPU_X86
  if (use_avx512(isa)) {
    switch (m) {
      case 1: return dot_tokens_avx512<1>(a, w, rows, K, out, ldo);
      case 2: return dot_tokens_avx512<2>(a, w, rows, K, out, ldo);
      case 3: return dot_tokens_avx512<3>(a, w, rows, K, out, ldo);
      case 4: return dot_tokens_avx512<4>(a, w, rows, K, out, ldo);
      default: break;
    }
  } else if (use_avx2(isa) && m >= 1 && m <= kDotTokens) {
    return dot_tokens_avx2(a, m, Fp32RowsAvx2{w, K}, rows, K, out, ldo);
  }
#endif
  for (int t = 0; t < m; ++t) dot_rows(isa, a[t], w, rows, K, out + t * ldo);
}

void nvfp4_dot_rows_tokens(CpuIsa isa, const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch) {
#ifdef NVFP4_CPU_X86
  if (use_avx512(isa)) {
    switch (m) {
      case 1: return nvfp4_dot_avx512<1>(lut, a, codes, scales, n, K, out, ldo);
      case 2: return nvfp4_dot_avx512<2>(lut, a, codes, scales, n, K, out, ldo);
      case 3: return nvfp4_dot_avx512<3>(lut, a, codes, scales, n, K, out, ldo);
      case 4: return nvfp4_dot_avx512<4>(lut, a, codes, scales, n, K, out, ldo);
      default: break;
    }
  } else if (use_avx2(isa) && m >= 1 && m <= kDotTokens) {
    int8_t* iw = reinterpret_cast<int8_t*>(scratch);
    float* half = scratch + n * K / 4;  // K is a multiple of 16
    decode_int8_rows_avx2<fmt::kBlock>(codes, scales, n, K, iw, half, [&](uint8_t b) { return lut.e4m3[b]; });
    return dot_tokens_avx2(a, m, Int8BlockRowsAvx2<fmt::kBlock>{iw, half, K, K / fmt::kBlock}, n, K, out, ldo);
  }
#endif
  dequant_rows_noglobal(isa, lut, codes, scales, n, K, scratch);
  dot_rows_tokens(isa, a, m, scratch, n, K, out, ldo);
}

void mxfp4_dot_rows_tokens(CpuIsa isa, const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch) {
#ifdef NVFP4_CPU_X86
  if (!use_avx512(isa) && use_avx2(isa) && m >= 1 && m <= kDotTokens) {
    int8_t* iw = reinterpret_cast<int8_t*>(scratch);
    float* half = scratch + n * K / 4;  // K is a multiple of 32
    decode_int8_rows_avx2<fmt::kMxBlock>(codes, scales, n, K, iw, half, fmt::ue8m0_value);
    return dot_tokens_avx2(a, m, Int8BlockRowsAvx2<fmt::kMxBlock>{iw, half, K, K / fmt::kMxBlock}, n, K, out, ldo);
  }
#endif
  dequant_mxfp4_rows(isa, lut, codes, scales, n, K, scratch);
  dot_rows_tokens(isa, a, m, scratch, n, K, out, ldo);
}

void bf16_dot_rows_tokens(CpuIsa isa, const float* const* a, int m, const Bf16* w, int64_t n, int64_t K, float* out,
                          int64_t ldo, float* scratch) {
#ifdef NVFP4_CPU_X86
  if (use_avx512(isa)) {
    switch (m) {
      case 1: return bf16_dot_avx512<1>(a, w, n, K, out, ldo);
      case 2: return bf16_dot_avx512<2>(a, w, n, K, out, ldo);
      case 3: return bf16_dot_avx512<3>(a, w, n, K, out, ldo);
      case 4: return bf16_dot_avx512<4>(a, w, n, K, out, ldo);
      default: break;
    }
  } else if (use_avx2(isa) && m >= 1 && m <= kDotTokens) {
    return dot_tokens_avx2(a, m, Bf16RowsAvx2{w, K}, n, K, out, ldo);
  }
#endif
  widen_bf16(isa, w, n * K, scratch);
  dot_rows_tokens(isa, a, m, scratch, n, K, out, ldo);
}

// The best ISA's versions.
void dequant_rows_noglobal(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n,
                           int64_t K, float* out) {
  dequant_rows_noglobal(cpu_isa_best(), lut, codes, scales, n, K, out);
}
void dequant_mxfp4_rows(const E2m1PairTable& lut, const uint8_t* codes, const uint8_t* scales, int64_t n, int64_t K,
                        float* out) {
  dequant_mxfp4_rows(cpu_isa_best(), lut, codes, scales, n, K, out);
}
void dot_rows(const float* a, const float* w, int64_t rows, int64_t K, float* out) {
  dot_rows(cpu_isa_best(), a, w, rows, K, out);
}
void widen_bf16(const Bf16* w, int64_t n, float* out) { widen_bf16(cpu_isa_best(), w, n, out); }
void widen_fp8_row(const E2m1PairTable& lut, const uint8_t* w, const float* tile_scales, int64_t K, float* out) {
  widen_fp8_row(cpu_isa_best(), lut, w, tile_scales, K, out);
}
void dot_rows_tokens(const float* const* a, int m, const float* w, int64_t rows, int64_t K, float* out,
                     int64_t ldo) {
  dot_rows_tokens(cpu_isa_best(), a, m, w, rows, K, out, ldo);
}
void nvfp4_dot_rows_tokens(const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch) {
  nvfp4_dot_rows_tokens(cpu_isa_best(), lut, a, m, codes, scales, n, K, out, ldo, scratch);
}
void mxfp4_dot_rows_tokens(const E2m1PairTable& lut, const float* const* a, int m, const uint8_t* codes,
                           const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo, float* scratch) {
  mxfp4_dot_rows_tokens(cpu_isa_best(), lut, a, m, codes, scales, n, K, out, ldo, scratch);
}
void bf16_dot_rows_tokens(const float* const* a, int m, const Bf16* w, int64_t n, int64_t K, float* out,
                          int64_t ldo, float* scratch) {
  bf16_dot_rows_tokens(cpu_isa_best(), a, m, w, n, K, out, ldo, scratch);
}

}  // namespace nvfp4moe::cpu
