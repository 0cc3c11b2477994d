// Block-scaled FP8 shared-expert weights for tests: random E4M3 bit patterns
// (never NaN) and one factor per 128x128 tile, either powers of two (what a
// checkpoint's F8_E8M0 `scale` bytes hold) or arbitrary positive floats (an
// F32 `weight_scale_inv`), plus the BF16 weights with the same values.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "support/test_util.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::test {

enum class TileScales { PowersOfTwo, Arbitrary };

// E4M3 bytes of a [rows, cols] weight with std ~ 1/sqrt(cols) once scaled:
// any byte but the NaNs 0x7F / 0xFF.
inline std::vector<uint8_t> random_e4m3(Rng& rng, int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(n));
  for (auto& x : b) {
    x = uint8_t(rng.next());
    while ((x & 0x7F) == 0x7F) x = uint8_t(rng.next());
  }
  return b;
}

inline std::vector<float> random_tile_scales(Rng& rng, int64_t rows, int64_t cols, TileScales kind, float base) {
  const int64_t t = SharedExpertWeights::kFp8Tile;
  std::vector<float> s(static_cast<size_t>(((rows + t - 1) / t) * ((cols + t - 1) / t)));
  for (auto& v : s)
    v = kind == TileScales::PowersOfTwo ? std::ldexp(base, int(rng.below(5)) - 2) : base * rng.uniform(0.25f, 4.0f);
  return s;
}

// FP8 shared expert of Is x H; `base` sets the factor's magnitude (E4M3 values
// reach 448, so base ~ 1/(448 sqrt(K)) keeps the projections O(1)).
inline SharedExpertWeights random_fp8_shared(Rng& rng, int64_t H, int64_t Is, TileScales kind) {
  SharedExpertWeights s;
  s.format = SharedExpertFormat::Fp8Block;
  s.w1_fp8 = random_e4m3(rng, Is * H);
  s.w3_fp8 = random_e4m3(rng, Is * H);
  s.w2_fp8 = random_e4m3(rng, H * Is);
  const float b1 = std::ldexp(1.0f, -int(std::lround(std::log2(16.0 * std::sqrt(double(H))))));
  const float b2 = std::ldexp(1.0f, -int(std::lround(std::log2(16.0 * std::sqrt(double(Is))))));
  s.w1_scale = random_tile_scales(rng, Is, H, kind, b1);
  s.w3_scale = random_tile_scales(rng, Is, H, kind, b1);
  s.w2_scale = random_tile_scales(rng, H, Is, kind, b2);
  return s;
}

// The BF16 weights holding the FP8 weights' values: exact when every tile
// factor is a power of two (an E4M3 value has 4 significant bits).
inline SharedExpertWeights bf16_twin(const SharedExpertWeights& s, int64_t H, int64_t Is) {
  const int64_t t = SharedExpertWeights::kFp8Tile;
  auto widen = [&](const std::vector<uint8_t>& q, const std::vector<float>& sc, int64_t rows, int64_t cols) {
    std::vector<Bf16> w(q.size());
    const int64_t tc = (cols + t - 1) / t;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        w[size_t(r * cols + c)] = bf16_from_float(e4m3_decode(q[size_t(r * cols + c)]) * sc[size_t((r / t) * tc + c / t)]);
    return w;
  };
  SharedExpertWeights b;
  b.w1 = widen(s.w1_fp8, s.w1_scale, Is, H);
  b.w3 = widen(s.w3_fp8, s.w3_scale, Is, H);
  b.w2 = widen(s.w2_fp8, s.w2_scale, H, Is);
  return b;
}

}  // namespace nvfp4moe::test
