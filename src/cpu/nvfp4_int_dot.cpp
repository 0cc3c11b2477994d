// SIMD versions of the exact integer NVFP4 x NVFP4 dots (contract and scalar
// definition: nvfp4_int_dot.hpp), and the activation packing.
//
// NOTES: per 128-element chunk and weight row, AVX-512 decodes 64 code bytes
// with two vpshufb (nibble -> iw + 12 as an unsigned byte), then per token
// two vpdpbusd (u8 x s8, 4 products per int32 lane) give the 16 exact
// half-block sums; one convert, one multiply by the weight's lane scales and
// one FMA by the activation's lane scales add them to the FP32 lanes. The
// weight's 8 UE4M3 scale bytes become 16 lane floats through FP16: the byte
// shifted into an FP16 pattern is e4m3 / 256 exactly (subnormals included),
// so one vcvtph2ps replaces a table lookup; 0x7F / 0xFF are patched to NaN.
// Decoded weights stay in registers for up to 8 tokens (AVX2: 4), so a
// 16-row tile's codes are read from memory once per group of tokens.
//
// NOTES: memory. A tile's codes are one contiguous run of bytes (and its
// scales another); at 1..2 tokens the rows are read one after another (R = 1),
// so each core reads one ascending stream. The hardware streamer does not
// cross 4 KiB pages and ramps up again after each, which left batch 1 at a
// fraction of the read bandwidth, so every row loop prefetches its own
// stream: kPrefetchL2 bytes ahead into L2, kPrefetchL1 ahead into L1, its
// scales one line per 8 chunks. Past a tile's end the prefetches touch the
// next tile's first rows, which is cheaper (measured) than stopping at the
// end. Prefetches change no result.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "cpu/nvfp4_int_dot.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's AVX-512 headers self-initialise undefined vectors (`__Y = __Y`)
// and warn about it where they are inlined.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define NVFP4_INT_X86 1
#endif

#include "cpu/e4m3_simd.hpp"

namespace nvfp4moe::cpu {

bool pack_int_act_row(const float* v, int64_t K, IntActRows& rows, int64_t r) {
  int8_t* q = rows.q.data() + r * rows.chunks * kIntChunk;
  float* scale = rows.scale.data() + r * rows.chunks * kIntLanes;
  int32_t* bias = rows.bias.data() + r * rows.chunks * kIntLanes;
  static constexpr int kCandidates[] = {12, 8, 6, 4, 3, 2, 1};  // |ia| of the block's largest element
  for (int64_t b0 = 0; b0 < K; b0 += 16) {
    const float* x = v + b0;
    float m = 0.0f;
    bool nan = false;
    for (int i = 0; i < 16; ++i) {
      if (std::isinf(x[i])) return false;
      nan |= std::isnan(x[i]);
      m = std::fabs(x[i]) > m ? std::fabs(x[i]) : m;
    }
    int ia[16] = {};
    float sigma = 0.0f;
    if (nan) {
      sigma = NAN;
    } else if (m > 0.0f) {
      bool found = false;
      for (int c : kCandidates) {
        sigma = m / float(c);
        uint32_t bits;
        std::memcpy(&bits, &sigma, 4);
        if ((bits & 0x7FFFu) != 0 || !(sigma >= 0x1p-100f && sigma <= 0x1p64f)) continue;  // <= 8 significant bits
        bool ok = true;
        for (int i = 0; i < 16 && ok; ++i) {
          const float n = std::nearbyint(x[i] / sigma);
          ok = std::fabs(n) <= 12.0f && std::fma(n, sigma, -x[i]) == 0.0f;
          ia[i] = int(n);
        }
        if (ok) {
          found = true;
          break;
        }
      }
      if (!found) return false;
    }
    for (int i = 0; i < 16; ++i) {
      const int64_t e = b0 + i, c = e / kIntChunk, j = e % kIntChunk;
      q[c * kIntChunk + (j & 1) * 64 + j / 2] = int8_t(ia[i]);
    }
    for (int h = 0; h < 2; ++h) {
      const int64_t e0 = b0 + 8 * h, lane = (e0 / kIntChunk) * kIntLanes + (e0 % kIntChunk) / 8;
      int32_t s = 0;
      for (int i = 0; i < 8; ++i) s += ia[8 * h + i];
      bias[lane] = -kIntWeightBias * s;
      scale[lane] = 128.0f * sigma;
    }
  }
  rows.exact[size_t(r)] = 1;
  return true;
}

namespace {

#ifdef NVFP4_INT_X86
bool has_avx512_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return yes;
}
bool has_avx2_f16c() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return yes;
}

#define NVFP4_AVX512_INT __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c,fma")))
#define NVFP4_AVX2_INT __attribute__((target("avx2,fma,f16c")))

// 8 UE4M3 bytes -> 16 lane floats e4m3(b_{l/2}) / 256.
NVFP4_AVX512_INT inline __m512 lane_scales_avx512(__m128i bytes8) {
  return _mm512_cvtph_ps(e4m3_half_patterns(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(bytes8, bytes8))));
}

// The pairwise lane sum of the contract: l + 8, l + 4, l + 2, l + 1.
NVFP4_AVX512_INT inline float lane_sum_avx512(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(v),
                                  _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

constexpr int64_t kPrefetchL2 = 4096;  // bytes ahead in a row's code stream (T1)
constexpr int64_t kPrefetchL1 = 1024;  // (T0)

// The prefetches of one row's stream at chunk c: codes `cr` and scales `sr` of that chunk.
inline void prefetch_row_chunk(const uint8_t* cr, const uint8_t* sr, int64_t c) {
  _mm_prefetch(reinterpret_cast<const char*>(cr + kPrefetchL2), _MM_HINT_T1);
  _mm_prefetch(reinterpret_cast<const char*>(cr + kPrefetchL1), _MM_HINT_T0);
  if ((c & 7) == 0) _mm_prefetch(reinterpret_cast<const char*>(sr + kPrefetchL2 / 8), _MM_HINT_T0);
}

// M tokens x R weight rows per pass.
template <int M, int R>
NVFP4_AVX512_INT void int_dot_avx512(const IntWeightTable& wt, const IntActRow* a, const uint8_t* codes,
                                     const uint8_t* scales, int64_t r0, int64_t K, float* out, int64_t ldo) {
  const __m512i table = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt.u)));
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t chunks = int_chunks(K), full = K / kIntChunk;
  const __mmask64 code_mask = (uint64_t(1) << ((K % kIntChunk) / 2)) - 1;  // tail chunk: < 64 bytes
  const __mmask16 scale_mask = __mmask16((1u << ((K % kIntChunk) / 16)) - 1);
  __m512 acc[M][R];
  for (int t = 0; t < M; ++t)
    for (int r = 0; r < R; ++r) acc[t][r] = _mm512_setzero_ps();
  for (int64_t c = 0; c < chunks; ++c) {
    __m512i wl[R], wh[R];
    __m512 sw[R];
    for (int r = 0; r < R; ++r) {
      const uint8_t* cr = codes + (r0 + r) * (K / 2) + c * 64;
      const uint8_t* sr = scales + (r0 + r) * (K / 16) + c * 8;
      prefetch_row_chunk(cr, sr, c);
      __m512i x;
      __m128i sb;
      if (c < full) {
        x = _mm512_loadu_si512(cr);
        sb = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(sr));
      } else {
        x = _mm512_maskz_loadu_epi8(code_mask, cr);
        sb = _mm_maskz_loadu_epi8(scale_mask, sr);
      }
      wl[r] = _mm512_shuffle_epi8(table, _mm512_and_si512(x, low4));
      wh[r] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(x, 4), low4));
      sw[r] = lane_scales_avx512(sb);
    }
    for (int t = 0; t < M; ++t) {
      const int8_t* q = a[t].q + c * kIntChunk;
      const __m512i qlo = _mm512_loadu_si512(q), qhi = _mm512_loadu_si512(q + 64);
      const __m512i bias = _mm512_loadu_si512(a[t].bias + c * kIntLanes);
      const __m512 sa = _mm512_loadu_ps(a[t].scale + c * kIntLanes);
      for (int r = 0; r < R; ++r) {
        const __m512i s = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, wl[r], qlo), wh[r], qhi);
        acc[t][r] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(s), sw[r]), sa, acc[t][r]);
      }
    }
  }
  for (int t = 0; t < M; ++t)
    for (int r = 0; r < R; ++r) out[t * ldo + r0 + r] = lane_sum_avx512(acc[t][r]);
}

template <int M>
NVFP4_AVX512_INT void int_dot_rows_avx512(const IntWeightTable& wt, const IntActRow* a, const uint8_t* codes,
                                          const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo) {
  // M * R <= 16 accumulators; one row at a time where the loads bound (M <= 2).
  constexpr int R = M <= 2 ? 1 : 2;
  int64_t r0 = 0;
  for (; r0 + R <= n; r0 += R) int_dot_avx512<M, R>(wt, a, codes, scales, r0, K, out, ldo);
  for (; r0 < n; ++r0) int_dot_avx512<M, 1>(wt, a, codes, scales, r0, K, out, ldo);
}

// 8 UE4M3 bytes -> 16 lane floats e4m3(b_{l/2}) / 256: lanes 0..7 in lo,
// 8..15 in hi (the two halves of a chunk).
NVFP4_AVX2_INT inline void lane_scales_avx2(uint64_t bytes8, __m256& lo, __m256& hi) {
  const __m128i b = _mm_cvtsi64_si128(int64_t(bytes8));
  const __m256i h = e4m3_half_patterns(_mm256_cvtepi8_epi16(_mm_unpacklo_epi8(b, b)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

// The same for bytes 0x00..0x7E (finite and >= 0, every byte a layer's
// checks let through): each byte zero-extended into the two 16-bit lanes of
// its block by one shuffle and shifted into FP16's fields, with no sign or
// NaN patch; equal to lane_scales_avx2 on those bytes.
NVFP4_AVX2_INT inline void lane_scales_plain_avx2(uint64_t bytes8, __m256& lo, __m256& hi) {
  const __m128i b = _mm_cvtsi64_si128(int64_t(bytes8));
  const __m128i spread_lo = _mm_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1);
  const __m128i spread_hi = _mm_setr_epi8(4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
  lo = _mm256_cvtph_ps(_mm_slli_epi16(_mm_shuffle_epi8(b, spread_lo), 7));
  hi = _mm256_cvtph_ps(_mm_slli_epi16(_mm_shuffle_epi8(b, spread_hi), 7));
}

// Whether every byte of s[0, n) is 0x00..0x7E (lane_scales_plain_avx2 holds).
NVFP4_AVX2_INT inline bool scales_plain_avx2(const uint8_t* s, int64_t n) {
  const __m256i top = _mm256_set1_epi8(0x7E);
  __m256i hi = top;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) hi = _mm256_max_epu8(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i)));
  bool plain = _mm256_movemask_epi8(_mm256_cmpeq_epi8(hi, top)) == -1;
  for (; i < n; ++i) plain &= s[i] < 0x7F;
  return plain;
}

NVFP4_AVX2_INT inline float lane_sum_avx2(__m256 lo, __m256 hi) {
  const __m256 s8 = _mm256_add_ps(lo, hi);
  const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// One 128-element chunk of one weight row (64 code bytes at cb, its 8 scale
// bytes sb) into the accumulators of M <= 4 tokens; lanes 0..7 and 8..15 of
// the chunk in two ymm, each half's codes loaded and decoded when it is used
// (fewer live registers). kPlain: every scale byte is 0x00..0x7E.
template <int M, bool kPlain>
NVFP4_AVX2_INT inline void int_chunk_avx2(const uint8_t* cb, uint64_t sb, const IntActRow* a, int64_t c,
                                          __m256i table, __m256 (&acc)[M][2]) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  __m256 sw[2];
  if constexpr (kPlain)
    lane_scales_plain_avx2(sb, sw[0], sw[1]);
  else
    lane_scales_avx2(sb, sw[0], sw[1]);
  for (int h = 0; h < 2; ++h) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(cb + 32 * h));
    const __m256i wl = _mm256_shuffle_epi8(table, _mm256_and_si256(x, low4));
    const __m256i wh = _mm256_shuffle_epi8(table, _mm256_and_si256(_mm256_srli_epi16(x, 4), low4));
    for (int t = 0; t < M; ++t) {
      const int8_t* q = a[t].q + c * kIntChunk + 32 * h;
      const __m256i qlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      const __m256i qhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64));
      const __m256i bias = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[t].bias + c * kIntLanes + 8 * h));
      // Each int16 of a vpmaddubsw is two products, |.| <= 2 * 24 * 12 = 576,
      // so the low and high nibbles' pairs add in int16 (<= 1152) before
      // one widening vpmaddwd: the same integer, one instruction fewer.
      const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(wl, qlo), _mm256_maddubs_epi16(wh, qhi));
      const __m256i s = _mm256_add_epi32(bias, _mm256_madd_epi16(pairs, ones));
      const __m256 sa = _mm256_loadu_ps(a[t].scale + c * kIntLanes + 8 * h);
      acc[t][h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(s), sw[h]), sa, acc[t][h]);
    }
  }
}

// M <= 4 tokens, one weight row per pass. The full chunks load straight
// from the row: a copy through a stack buffer (zeroed, then written as
// 16-byte stores) makes each 32-byte load wait for two stores, which no
// store forwarding covers, and took 3-4x the memory time at batch 1
// (measured). Only the tail chunk of a row goes through the buffer, zero
// past K, after the loop.
template <int M, bool kPlain>
NVFP4_AVX2_INT void int_dot_row_avx2(const IntWeightTable& wt, const IntActRow* a, const uint8_t* codes,
                                     const uint8_t* scales, int64_t K, float* out, int64_t ldo) {
  const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(wt.u)));
  __m256 acc[M][2];
  for (int t = 0; t < M; ++t) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
  const int64_t full = K / kIntChunk;
  for (int64_t c = 0; c < full; ++c) {
    prefetch_row_chunk(codes + c * 64, scales + c * 8, c);
    uint64_t sb;
    std::memcpy(&sb, scales + c * 8, 8);
    int_chunk_avx2<M, kPlain>(codes + c * 64, sb, a, c, table, acc);
  }
  if (full * kIntChunk < K) {
    alignas(32) uint8_t cb[64] = {};
    uint64_t sb = 0;
    const int64_t e0 = full * kIntChunk;
    std::memcpy(cb, codes + e0 / 2, size_t((K - e0) / 2));
    std::memcpy(&sb, scales + e0 / 16, size_t((K - e0) / 16));
    int_chunk_avx2<M, kPlain>(cb, sb, a, full, table, acc);
  }
  for (int t = 0; t < M; ++t) out[t * ldo] = lane_sum_avx2(acc[t][0], acc[t][1]);
}

template <int M>
NVFP4_AVX2_INT void int_dot_rows_avx2(const IntWeightTable& wt, const IntActRow* a, const uint8_t* codes,
                                      const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo) {
  // NOTES (Zen 3, one thread, a 16 x 4096 tile in cache, min of 2000
  // calls): the sign and NaN patch of the scale bytes is 5 of the ~14
  // instructions of a chunk's scale conversion and holds 5 more constants,
  // which the compiler rebuilt inside the loop (16 ymm registers). One check
  // of a row's scale bytes (1 byte per 32 of codes, in L1 by then: the
  // previous rows' loops prefetch them) lets its loop skip the patch; with
  // the per-half decode and the tail chunk out of the loop
  // (int_dot_row_avx2) the tile took 2.10 / 3.10 / 4.44 / 6.33 us at 1 / 2 /
  // 3 / 4 tokens, against 3.00 / 3.82 / 5.14 / 7.23 before. A check of the
  // whole tile's scales at its start read them cold (8 % of the one-token
  // dots' samples in the Flash forward).
  for (int64_t r = 0; r < n; ++r) {
    const uint8_t* sr = scales + r * (K / 16);
    if (scales_plain_avx2(sr, K / 16))
      int_dot_row_avx2<M, true>(wt, a, codes + r * (K / 2), sr, K, out + r, ldo);
    else
      int_dot_row_avx2<M, false>(wt, a, codes + r * (K / 2), sr, K, out + r, ldo);
  }
}
#endif

}  // namespace

bool int_dot_isa_available(IntDotIsa isa) {
  switch (isa) {
    case IntDotIsa::Scalar: return true;
#ifdef NVFP4_INT_X86
    case IntDotIsa::Avx2: return has_avx2_f16c();
    case IntDotIsa::Avx512: return has_avx512_vnni();
#endif
    default: return false;
  }
}

IntDotIsa int_dot_isa_best() {
  if (int_dot_isa_available(IntDotIsa::Avx512)) return IntDotIsa::Avx512;
  if (int_dot_isa_available(IntDotIsa::Avx2)) return IntDotIsa::Avx2;
  return IntDotIsa::Scalar;
}

const char* int_dot_isa_name(IntDotIsa isa) {
  return isa == IntDotIsa::Avx512 ? "avx512-vnni" : isa == IntDotIsa::Avx2 ? "avx2" : "scalar";
}

void int_dot_rows_tokens(IntDotIsa isa, const E2m1PairTable& lut, const IntActRow* a, int m, const uint8_t* codes,
                         const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo) {
  static const IntWeightTable wt;
#ifdef NVFP4_INT_X86
  if (isa == IntDotIsa::Avx512 && has_avx512_vnni()) {
    switch (m) {
      case 1: return int_dot_rows_avx512<1>(wt, a, codes, scales, n, K, out, ldo);
      case 2: return int_dot_rows_avx512<2>(wt, a, codes, scales, n, K, out, ldo);
      case 3: return int_dot_rows_avx512<3>(wt, a, codes, scales, n, K, out, ldo);
      case 4: return int_dot_rows_avx512<4>(wt, a, codes, scales, n, K, out, ldo);
      case 5: return int_dot_rows_avx512<5>(wt, a, codes, scales, n, K, out, ldo);
      case 6: return int_dot_rows_avx512<6>(wt, a, codes, scales, n, K, out, ldo);
      case 7: return int_dot_rows_avx512<7>(wt, a, codes, scales, n, K, out, ldo);
      case 8: return int_dot_rows_avx512<8>(wt, a, codes, scales, n, K, out, ldo);
      default: break;
    }
  }
  if (isa == IntDotIsa::Avx2 && has_avx2_f16c() && m >= 1 && m <= kIntDotTokens) {
    for (int t0 = 0; t0 < m; t0 += 4) {
      const int mm = std::min(4, m - t0);
      float* o = out + t0 * ldo;
      switch (mm) {
        case 1: int_dot_rows_avx2<1>(wt, a + t0, codes, scales, n, K, o, ldo); break;
        case 2: int_dot_rows_avx2<2>(wt, a + t0, codes, scales, n, K, o, ldo); break;
        case 3: int_dot_rows_avx2<3>(wt, a + t0, codes, scales, n, K, o, ldo); break;
        default: int_dot_rows_avx2<4>(wt, a + t0, codes, scales, n, K, o, ldo); break;
      }
    }
    return;
  }
#endif
  int_dot_rows_tokens_ref(lut, a, m, codes, scales, n, K, out, ldo);
}

void int_dot_rows_tokens(const E2m1PairTable& lut, const IntActRow* a, int m, const uint8_t* codes,
                         const uint8_t* scales, int64_t n, int64_t K, float* out, int64_t ldo) {
  static const IntDotIsa best = int_dot_isa_best();
  int_dot_rows_tokens(best, lut, a, m, codes, scales, n, K, out, ldo);
}

}  // namespace nvfp4moe::cpu
