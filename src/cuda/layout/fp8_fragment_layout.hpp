// Fragment layout of the FP8 shared-expert kernels (kernels/shared_expert_fp8):
// E4M3 weights stored so that each warp streams its rows as contiguous
// 512-byte loads (one 16-byte piece per lane) that are exactly the A
// fragments of mma.sync m16n8k16, the same column assignment as the NVFP4
// decode layout (fragment_layout.hpp):
//   m-tile u: 16 rows. Gate/up (`pairs`): rows 0..7 are gate rows 8u..8u+7
//     ("lo") and rows 8..15 the up rows Is + 8u.. ("hi"), so a lane holds gate
//     and up of the same (row, token); down: rows 16u..16u+7 (lo), 16u+8.. (hi).
//   K tile kt: 128 columns (one scale tile), two 64-column chunks c.
//   piece: lane (g = lane / 4, t = lane % 4) owns columns 64c + 16t .. + 15 of
//     its lo row g and hi row g; bytes in column order (zero past K).
//   block (u, kt): [c][half lo, hi][32 lanes][16 bytes], 2 KB.
//   blocks: m-tiles in groups of 4 (64 rows, the wgmma form's CTA; the last
//     group may be narrower), each group K-tile-major: [group][kt][u % 4].
//     A K range of a group is one contiguous run of bytes, so the wgmma form
//     takes a stage of its 4 m-tiles in one bulk copy (bulk copies of up to
//     8 KB stream at about one per 0.35 us an SM on the H200; 16-32 KB ones
//     at ~42 GB/s an SM).
// The kernels read it and nothing else; fp8_fragment_offset is the one map
// between it and a row-major [rows, K] matrix.
#pragma once

#include <cstdint>
#include <vector>

#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

constexpr int64_t kFp8FragTileK = 128;     // K columns per tile
constexpr int64_t kFp8FragTileBytes = 2048;  // bytes of one (m-tile, K tile)
constexpr int64_t kFp8FragGroup = 4;         // m-tiles of a group

struct Fp8FragmentGeometry {
  int64_t rows = 0, cols = 0;  // the row-major matrix: gate/up [2 Is, H], down [H, Is]
  bool pairs = false;          // gate/up rows paired as above
  NVFP4_HD int64_t m_tiles() const { return pairs ? rows / 16 : (rows + 15) / 16; }
  NVFP4_HD int64_t k_tiles() const { return (cols + kFp8FragTileK - 1) / kFp8FragTileK; }
  NVFP4_HD int64_t bytes() const { return m_tiles() * k_tiles() * kFp8FragTileBytes; }
};

// Index of block (u, kt) of a layout of m_tiles x k_tiles blocks.
NVFP4_HD int64_t fp8_fragment_block(int64_t m_tiles, int64_t k_tiles, int64_t u, int64_t kt) {
  const int64_t u0 = u - u % kFp8FragGroup;
  const int64_t width = m_tiles - u0 < kFp8FragGroup ? m_tiles - u0 : kFp8FragGroup;
  return u0 * k_tiles + kt * width + (u - u0);
}

// Byte offset of element (row, k) of the row-major matrix in the layout.
NVFP4_HD int64_t fp8_fragment_offset(const Fp8FragmentGeometry& g, int64_t row, int64_t k) {
  int64_t u, half, r;
  if (g.pairs) {
    const int64_t inter = g.rows / 2;
    half = row >= inter ? 1 : 0;
    u = (row - half * inter) / 8;
    r = row % 8;
  } else {
    u = row / 16;
    half = (row % 16) / 8;
    r = row % 8;
  }
  const int64_t kt = k / kFp8FragTileK, c = (k % kFp8FragTileK) / 64, t = (k % 64) / 16;
  const int64_t lane = r * 4 + t;
  return fp8_fragment_block(g.m_tiles(), g.k_tiles(), u, kt) * kFp8FragTileBytes + ((c * 2 + half) * 32 + lane) * 16 +
         k % 16;
}

// Row-major E4M3 [rows, cols] -> the layout (zero bytes where no element maps).
// Gate/up: rows a multiple of 16 (Is a multiple of 8); down: any.
std::vector<uint8_t> fp8_fragments(const std::vector<uint8_t>& row_major, const Fp8FragmentGeometry& g);

}  // namespace nvfp4moe::cuda
