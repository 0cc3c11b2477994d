// E4M3 bytes as FP16 bit patterns, the one way the CPU's SIMD kernels turn
// UE4M3 block scales (the integer dots) and E4M3 weights (the FP8 shared
// expert) into floats: vcvtph2ps of these patterns instead of a table.
#pragma once

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

namespace nvfp4moe::cpu {

// 16 E4M3 bytes, each sign-extended to 16 bits (vpmovsxbw), -> the FP16
// patterns of e4m3 / 256, exact: the byte shifted left by 7 puts its
// exponent and mantissa in FP16's fields (FP16's exponent bias is 8 more
// than E4M3's, subnormals included) and its sign in bit 15; the sign's copy
// in bit 14 is cleared. 0x7F / 0xFF become FP16's quiet NaN with the
// byte's sign, which widens to the bits of e4m3_value's NaN.
__attribute__((target("avx2"))) inline __m256i e4m3_half_patterns(__m256i sign_extended) {
  const __m256i h = _mm256_and_si256(_mm256_slli_epi16(sign_extended, 7), _mm256_set1_epi16(short(0xBFFF)));
  const __m256i nan = _mm256_cmpeq_epi16(_mm256_and_si256(h, _mm256_set1_epi16(0x7FFF)), _mm256_set1_epi16(0x3F80));
  const __m256i sign = _mm256_and_si256(h, _mm256_set1_epi16(short(0x8000)));
  const __m256i quiet = _mm256_or_si256(sign, _mm256_set1_epi16(0x7E00));
  return _mm256_blendv_epi8(h, quiet, nan);
}

}  // namespace nvfp4moe::cpu
#endif
