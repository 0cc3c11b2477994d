// Random (block maximum, global scale) pairs as the staging kernels meet
// them, and the global scales of the exhaustive block-scale tests, for the
// tests of the block scale's fast path on the CPU (test_fast_quantize.cpp)
// and on the GPU (test_block_scale.cu).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "format/nvfp4_codec.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

struct BlockScaleCase {
  float amax, g;
};

// g: a row maximum / 2688 (3 draws in 4), else a static g over 2^-120..2^120.
// amax: at or below the row's maximum, or m * f32(6 g) with m an E4M3 value
// or the midpoint of two neighbours (the E4M3 rounding's ties), a value below
// 2^-9 (the lower clamp) or above 448 (the upper one, static g); one ulp off
// in a quarter of the draws. amax may overflow to Inf for a huge static g.
inline BlockScaleCase random_block_scale_case(Rng& rng) {
  const float row_amax = std::ldexp(1.0f + float(rng.uniform()), int(rng.below(120)) - 60);
  const float g = rng.below(4) ? fmt::global_scale_from_amax(row_amax)
                               : std::ldexp(1.0f + float(rng.uniform()), int(rng.below(240)) - 120);
  const float six_g = fmt::mul_rn(fmt::kE2M1Max, g);
  const uint8_t b = uint8_t(rng.below(fmt::kE4M3MaxByte));  // 0x00..0x7D and its upper neighbour
  const float lo = fmt::e4m3_value(b), hi = fmt::e4m3_value(uint8_t(b + 1));
  float amax;
  switch (rng.below(5)) {
    case 0: case 1: amax = row_amax * float(rng.uniform()); break;
    case 2: amax = (rng.below(2) ? lo : 0.5f * (lo + hi)) * six_g; break;  // midpoints are exact in FP32
    case 3: amax = std::ldexp(float(rng.uniform()), -9 - int(rng.below(8))) * six_g; break;  // t below 2^-9
    default: amax = (448.0f + float(rng.uniform()) * 64.0f * float(1 + rng.below(4))) * six_g; break;  // t above 448
  }
  if (rng.below(4) == 0) amax = std::nextafter(amax, rng.below(2) ? INFINITY : 0.0f);
  return {amax, g};
}

// Global scales whose every block maximum the exhaustive tests try (the
// CPU the first kCpuExhaustiveGs, the GPU all): a row maximum of 6 over 2688
// (f32(6 g) inexact), the static g of the staging tests, two whose f32(6 g)
// lies 1 and 2 ulp above the short significands 1.25 and 1.75 (where a
// quotient by a rounded reciprocal is most often off), powers of two (1,
// and a static 2^-10), more row maxima over 2688 (10, a BF16 value, 2^40)
// and the other static scales of the tests (3e-5, 7).
constexpr size_t kCpuExhaustiveGs = 4;
inline std::vector<float> exhaustive_block_scale_gs() {
  return {fmt::global_scale_from_amax(6.0f),
          0.0123f,
          fmt::bits_to_float(0x3fa00001u) / 6.0f,
          fmt::bits_to_float(0x3fe00003u) / 6.0f,
          1.0f,
          0x1p-10f,
          fmt::global_scale_from_amax(10.0f),
          fmt::global_scale_from_amax(3.140625f),
          fmt::global_scale_from_amax(0x1.4f3p40f),
          3e-5f,
          7.0f};
}

// The FP32 block maxima, as bit patterns [first, last), whose quotient t =
// amax / f32(6 g) lies in [2^-11, 2^10): from below the lower clamp (where
// E4M3 rounding alone would give byte 0x00) through every E4M3 value and
// tie to beyond saturation (448 and up), 21 binades of 2^23 patterns.
struct BitRange {
  uint32_t first, last;
};
inline BitRange exhaustive_block_maxima(float g) {
  const float six_g = fmt::mul_rn(fmt::kE2M1Max, g);
  return {fmt::float_to_bits(six_g * 0x1p-11f), fmt::float_to_bits(six_g * 0x1p10f)};
}

}  // namespace nvfp4moe::test
