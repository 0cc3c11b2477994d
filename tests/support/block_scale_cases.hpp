// Random (block maximum, global scale) pairs as the staging kernels meet
// them, for the tests of the block scale's fast path on the CPU
// (test_fast_quantize.cpp) and on the GPU (test_block_scale.cu).
#pragma once

#include <cmath>

#include "format/nvfp4_codec.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

struct BlockScaleCase {
  float amax, g;
};

// g: a row maximum / 2688 (3 draws in 4), else a static g over 2^-120..2^120.
// amax: at or below the row's maximum, or k/32 * 6g (k = 1..64: the E4M3
// rounding's ties and neighbours), one ulp off in a quarter of the draws.
// amax may overflow to Inf for a huge static g.
inline BlockScaleCase random_block_scale_case(Rng& rng) {
  const float row_amax = std::ldexp(1.0f + float(rng.uniform()), int(rng.below(120)) - 60);
  const float g = rng.below(4) ? fmt::global_scale_from_amax(row_amax)
                               : std::ldexp(1.0f + float(rng.uniform()), int(rng.below(240)) - 120);
  float amax = rng.below(2) ? row_amax * float(rng.uniform()) : std::ldexp(float(1 + rng.below(64)), -5) * 6.0f * g;
  if (rng.below(4) == 0) amax = std::nextafter(amax, rng.below(2) ? INFINITY : 0.0f);
  return {amax, g};
}

}  // namespace nvfp4moe::test
