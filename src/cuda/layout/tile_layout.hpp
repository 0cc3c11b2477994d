// The tile layout of the reference grouped GEMM (kernels/ref/grouped_gemm_ref.hpp),
// produced in ONE place: pack_expert_weights (host, at upload).
#pragma once

#include <cstdint>

#include "cuda/layout/projection.hpp"

namespace nvfp4moe::cuda {

// Weights of one expert and projection are stored as [n_tiles][k_steps] chunks
// of kTileBytes: kTileN rows x kTileK columns, codes first (32 bytes a row),
// then scale bytes (4 a row: the multiplier bytes of scale_multiplier.hpp). Inside each 8-byte
// block of 16 codes the bytes are reordered [0,4,1,5,2,6,3,7] so that lane
// (l % 4) = j of an mma fragment reads bytes j and 4 + j (columns 2j, 2j+1
// and 2j+8, 2j+9) as one 16-bit load. Rows and columns past N and K are zero
// bytes (multiplier byte 0 -> zero values).
//   L2 (down): tile row r of n-tile t is weight row t*128 + r.
//   L1 (gate/up fused): n-tile t covers intermediate indices i in
//   [t*64, t*64 + 64); within each group of 16 rows, rows 0..7 are GATE rows
//   i0..i0+7 and rows 8..15 are the UP rows of the same i, so the mma
//   accumulator of one thread holds gate and up of the same (i, token) and
//   the SwiGLU runs in registers.
constexpr int kTileN = 128;
constexpr int kTileK = 64;
constexpr int kTileCodeBytes = kTileN * kTileK / 2;    // 4096
constexpr int kTileScaleBytes = kTileN * kTileK / 16;  // 512
constexpr int kTileBytes = kTileCodeBytes + kTileScaleBytes;

struct PackedGeometry {
  int64_t n_tiles = 0, k_steps = 0;
  int64_t bytes_per_expert() const { return n_tiles * k_steps * kTileBytes; }
};
// L1: N = 2I (as I/64 tiles of 64 gate + 64 up rows), K = H. L2: N = H, K = I.
PackedGeometry packed_geometry(Projection p, int64_t hidden, int64_t intermediate);

// Linear bytes of ONE expert -> tile layout (out: bytes_per_expert()).
// GateUp: codes [2I, H/2] (gate rows then up rows), multiplier bytes [2I, H/16]
// (encode_weight_scales). Down: codes [H, I/2], multiplier bytes [H, I/16].
void pack_expert_weights(Projection p, const uint8_t* codes, const uint8_t* scales, int64_t hidden,
                         int64_t intermediate, uint8_t* out);
// The inverse (tests): tile layout -> linear codes and scales of one expert.
void unpack_expert_weights(Projection p, const uint8_t* packed, int64_t hidden, int64_t intermediate,
                           uint8_t* codes, uint8_t* scales);

}  // namespace nvfp4moe::cuda
