// The one place where ExpertWeights' linear NVFP4 bytes become the grouped
// GEMM's tile layout (described in grouped_gemm_ref.hpp), and back.
#include <cstring>

#include "cuda/layout/tile_layout.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

// Destination byte p of an 8-byte code block holds source byte kByteOrder[p].
constexpr int kByteOrder[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int64_t ceil_div64(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Source weight row of tile row r in n-tile t, or -1 for a zero (padding) row.
int64_t source_row(Projection p, int64_t t, int r, int64_t hidden, int64_t inter) {
  if (p == Projection::Down) {
    int64_t row = t * kTileN + r;
    return row < hidden ? row : -1;
  }
  const int group = r / 16, within = r % 16;
  const int64_t i = t * (kTileN / 2) + group * 8 + (within % 8);
  if (i >= inter) return -1;
  return within < 8 ? i : inter + i;
}

// Visits every (packed byte, linear byte) correspondence of one expert.
template <typename Fn>
void for_each_byte(Projection p, int64_t hidden, int64_t inter, Fn&& fn) {
  const PackedGeometry g = packed_geometry(p, hidden, inter);
  const int64_t K = p == Projection::Down ? inter : hidden;
  const int64_t row_codes = K / 2, row_scales = K / 16;
  for (int64_t t = 0; t < g.n_tiles; ++t)
    for (int64_t s = 0; s < g.k_steps; ++s) {
      const int64_t base = (t * g.k_steps + s) * kTileBytes;
      for (int r = 0; r < kTileN; ++r) {
        const int64_t src = source_row(p, t, r, hidden, inter);
        for (int b = 0; b < kTileK / 2; ++b) {
          const int64_t col = s * (kTileK / 2) + (b / 8) * 8 + kByteOrder[b % 8];
          const bool live = src >= 0 && col < row_codes;
          fn(/*is_code=*/true, base + r * (kTileK / 2) + b, live ? src * row_codes + col : -1);
        }
        for (int c = 0; c < kTileK / 16; ++c) {
          const int64_t col = s * (kTileK / 16) + c;
          const bool live = src >= 0 && col < row_scales;
          fn(false, base + kTileCodeBytes + r * (kTileK / 16) + c, live ? src * row_scales + col : -1);
        }
      }
    }
}

}  // namespace

PackedGeometry packed_geometry(Projection p, int64_t hidden, int64_t inter) {
  NVFP4_CHECK(hidden > 0 && inter > 0 && hidden % 16 == 0 && inter % 16 == 0,
              "packed_geometry: H and I must be positive multiples of 16, got H=", hidden, " I=", inter);
  PackedGeometry g;
  if (p == Projection::GateUp) {
    g.n_tiles = ceil_div64(inter, kTileN / 2);
    g.k_steps = ceil_div64(hidden, kTileK);
  } else {
    g.n_tiles = ceil_div64(hidden, kTileN);
    g.k_steps = ceil_div64(inter, kTileK);
  }
  return g;
}

void pack_expert_weights(Projection p, const uint8_t* codes, const uint8_t* scales, int64_t hidden,
                         int64_t inter, uint8_t* out) {
  for_each_byte(p, hidden, inter, [&](bool is_code, int64_t dst, int64_t src) {
    out[dst] = src < 0 ? uint8_t(0) : (is_code ? codes[src] : scales[src]);
  });
}

void unpack_expert_weights(Projection p, const uint8_t* packed, int64_t hidden, int64_t inter,
                           uint8_t* codes, uint8_t* scales) {
  for_each_byte(p, hidden, inter, [&](bool is_code, int64_t dst, int64_t src) {
    if (src >= 0) (is_code ? codes : scales)[src] = packed[dst];
  });
}

}  // namespace nvfp4moe::cuda
