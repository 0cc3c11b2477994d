// Fragment layout of sm90_nvfp4_decode_gemm, the register-direct decode GEMM:
// NVFP4 weights stored so that ONE 16-byte load per lane and chunk feeds the
// A fragments of four mma.sync.m16n8k16 (BF16) instructions, and 11 integer
// operations turn 8 codes into 4 BF16x2 registers (1.4 per value, under the
// ~1.5 that streaming 4.4 TB/s allows; docs/kernels.md).
//
// Units of the layout, per expert and projection:
//   m-tile: 16 weight rows (the mma M). GateUp: rows 0..7 are GATE rows
//     i0..i0+7 and rows 8..15 the UP rows of the same i (i0 = 8 * m-tile), so
//     one thread's accumulators hold gate and up of the same (i, token) and
//     the SwiGLU runs in registers. Down: rows 16 * m-tile + 0..15.
//   chunk: 64 columns of K. Lane (g = lane / 4, t = lane % 4) of the warp owns
//     the 16 columns [64c + 16t, 64c + 16t + 16) of rows g and g + 8 — ONE
//     scale block per row — and the activation operand is the same 16
//     contiguous columns of its token (two 16-byte loads, no shuffles).
//   codes: [expert][m_tiles][k_chunks][32 lanes] x 16 bytes; 32-bit word s of
//     a lane is mma k-step s of the chunk and holds the 8 codes of A fragment
//     registers a0..a3 (rows g, g+8, g, g+8) for columns 16t + 4s + {0,1}
//     (a0, a1) and 16t + 4s + {2,3} (a2, a3), at the bit positions below.
//   scales: [expert][m_tiles][k_chunks / 2][scale_lanes] x 4 bytes; byte
//     2j + r is the multiplier byte (scale_multiplier.hpp: NVFP4 and MXFP4
//     alike) of row g + 8r for chunk 2 * (index) + j, 16-column block 4c + t.
//     NVFP4: 32 words, one a lane. MXFP4: 16, one per lane pair (lane >> 1),
//     since lanes t = 2u and 2u + 1 own the two halves of one 32-column
//     block, whose byte they share: 4.25 bits a weight, as the checkpoint.
//
// The dot product is invariant under a permutation of K applied to both
// operands, so assigning logical columns to mma k-slots this way is exact.
//
// Bit positions inside a fragment word (per 16-bit half h, code of half h of
// register i): each register becomes the BF16 bit pattern of value(q) * 2^-126
// — sign at bit 15, the 3 magnitude bits (E2M1 exponent and mantissa) at bits
// 8..6, so E2M1's subnormal 0.5 maps onto BF16's subnormal and the map is
// linear. The kernel multiplies by the block's multiplier M(d) (NVFP4: s *
// 2^106; a BF16 product, exact) and the epilogue by kFragEpilogue = 2^20
// (scale_multiplier.hpp).
#pragma once

#include <cstdint>

#include "cuda/layout/projection.hpp"
#include "cuda/layout/scale_multiplier.hpp"
#include "format/nvfp4_codec.hpp"

namespace nvfp4moe::cuda {

constexpr int kMmaTileRows = 16;   // rows of one m-tile
constexpr int kMmaChunkK = 64;     // K columns of one chunk
constexpr int kMmaScaleChunks = 2; // chunks per 32-bit scale word of a lane
constexpr int kFragBytes = 32 * 16;  // one m-tile x one chunk: 16 bytes a lane
// Source bit of the lowest magnitude bit / of the sign, for register i, half 0.
constexpr int kFragMagBit[4] = {6, 3, 0, 9};
constexpr int kFragSignBit[4] = {15, 12, 14, 13};

// 8 codes (low nibbles used) -> one fragment word: codes[2 * i + h] is half h
// of register i.
NVFP4_HD uint32_t pack_fragment_word(const uint8_t (&codes)[8]) {
  uint32_t w = 0;
  for (int i = 0; i < 4; ++i)
    for (int h = 0; h < 2; ++h) {
      const uint32_t c = codes[2 * i + h];
      w |= (c & 7u) << (kFragMagBit[i] + 16 * h);
      w |= ((c >> 3) & 1u) << (kFragSignBit[i] + 16 * h);
    }
  return w;
}

// The kernel's decode: 4 registers of BF16x2 bit patterns, value(q) * 2^-126.
// 11 integer operations (4 masks, 5 shifts, 2 ors).
NVFP4_HD void unpack_fragment_word(uint32_t w, uint32_t (&out)[4]) {
  out[0] = w & 0x81C081C0u;
  out[1] = (w << 3) & 0x81C081C0u;
  out[2] = ((w << 6) & 0x01C001C0u) | ((w << 1) & 0x80008000u);
  out[3] = ((w >> 3) & 0x01C001C0u) | ((w << 2) & 0x80008000u);
}

// Geometry of one projection in the fragment layout.
struct FragmentGeometry {
  int64_t m_tiles = 0, k_chunks = 0;
  int32_t scale_lanes = 32;  // scale words per (m-tile, word index): 32 NVFP4, 16 MXFP4
  int64_t code_bytes_per_expert() const { return m_tiles * k_chunks * kFragBytes; }
  int64_t scale_bytes_per_expert() const { return m_tiles * (k_chunks / kMmaScaleChunks) * scale_lanes * 4; }
};
// The scale word of `lane` within its (m-tile, word index) row.
NVFP4_HD int scale_word_of_lane(int scale_lanes, int lane) { return scale_lanes == 32 ? lane : lane >> 1; }
// One projection's weights of all local experts in the fragment layout.
struct FragmentWeights {
  const uint8_t* codes = nullptr;   // [E_local] x geometry.code_bytes_per_expert()
  const uint8_t* scales = nullptr;  // [E_local] x geometry.scale_bytes_per_expert()
  FragmentGeometry geometry;
  // The FP8 form's row exponents ([E_local][m_tiles * 16] in fragment row
  // order, fp8_operand.hpp), or null when these weights have none.
  const int8_t* fp8_rows = nullptr;
};

// Linear weight row of row r (0..15) of m-tile mt (GateUp: gate rows then
// up rows, I = intermediate).
int64_t fragment_source_row(Projection p, int64_t mt, int r, int64_t intermediate);

// Whether a layer of this H, I has the fragment layout (both projections):
// I % 8 == 0 and H, I multiples of 128.
bool fragment_layout_fits(int64_t hidden, int64_t intermediate);

// GateUp: M = 2I (I/8 m-tiles), K = H. Down: M = H, K = I. Throws unless the
// rows fill whole m-tiles and K whole scale words (I % 8, K % 128).
FragmentGeometry fragment_geometry(Projection p, int64_t hidden, int64_t intermediate,
                                   ExpertFormat format = ExpertFormat::Nvfp4);

// Linear bytes of ONE expert -> fragment layout. GateUp: codes [2I, H/2]
// (gate rows then up rows), multiplier bytes [2I, H/16] (encode_weight_scales);
// Down: codes [H, I/2], multiplier bytes [H, I/16]. A byte permutation
// (MXFP4: the two 16-column halves of each 32-column block must carry the
// same multiplier byte, as encode_weight_scales writes them; they are
// stored once).
void pack_fragment_weights(Projection p, const uint8_t* codes, const uint8_t* scales, int64_t hidden,
                           int64_t intermediate, uint8_t* out_codes, uint8_t* out_scales,
                           ExpertFormat format = ExpertFormat::Nvfp4);
// The inverse (tests).
void unpack_fragment_weights(Projection p, const uint8_t* packed_codes, const uint8_t* packed_scales,
                             int64_t hidden, int64_t intermediate, uint8_t* codes, uint8_t* scales,
                             ExpertFormat format = ExpertFormat::Nvfp4);

}  // namespace nvfp4moe::cuda
