// Rows of the `fp8` activation mode's values (DeepSeek's act_quant,
// docs/numerics.md §7) as BF16 bits, for the tests of the FP8 operand.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <vector>

#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

// [rows, ld] with `cols` live (a multiple of 128): each 128-column block
// normal values at a random spread 2^-35 .. 2^14 rounded to BF16, one block
// in seven all zero, then e4m3(q) * s of act_quant; the tail past cols NaN.
inline std::vector<uint16_t> act_quant_rows(Rng& rng, int64_t rows, int64_t cols, int64_t ld) {
  std::vector<uint16_t> out(size_t(rows * ld), 0x7FC0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t b = 0; b < cols / 128; ++b) {
      const float spread = std::ldexp(1.0f, int(rng.below(50)) - 35);
      float v[128], amax = 0.0f;
      for (float& x : v) {
        x = fmt::bits_to_float(fmt::float_to_bits(rng.normal() * spread) & 0xffff0000u);
        amax = std::max(amax, std::fabs(x));
      }
      if (rng.below(7) == 0) std::fill(std::begin(v), std::end(v), 0.0f), amax = 0.0f;
      const float s = fmt::fp8_act_block_scale(amax);
      for (int i = 0; i < 128; ++i)
        out[size_t(r * ld + b * 128 + i)] =
            uint16_t(fmt::float_to_bits(fmt::e4m3_value(fmt::fp8_act_code(v[i], s)) * s) >> 16);
    }
  return out;
}

}  // namespace nvfp4moe::test
