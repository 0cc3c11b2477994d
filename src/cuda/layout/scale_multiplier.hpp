// The weight scale bytes of the routed experts' kernel layouts (the fragment
// layout of the decode and prefill kernels, the tile layout of the
// reference GEMM): one MULTIPLIER BYTE d per weight row and 16 columns, for
// NVFP4 and MXFP4 experts alike, so that no kernel carries a format flag.
//
//   d = 0   the block dequantizes to zero; its codes are stored as zero.
//   d > 0   the BF16 multiplier M(d) whose bit pattern is (d << 4) + (223 << 7):
//           exponent field (d >> 3) + 223, top three mantissa bits d & 7, so
//           M(d) = (1 + (d & 7) / 8) * 2^((d >> 3) + 96), always a normal BF16.
//
// NVFP4. Every non-zero UE4M3 value s is (1 + m/8) * 2^E with E in [-9, 8]
// (the subnormals m' * 2^-9 written normalised), so d = ((E + 10) << 3) | m
// (8..151) gives M(d) = s * 2^106 exactly. A zero scale byte gives d = 0.
//
// MXFP4. The UE8M0 byte b is 2^(b - 127). Per expert and row group (gate
// rows, up rows, down rows) base = the smallest b over the blocks holding a
// non-zero code; d = (b - base + 1) << 3, which needs b - base <= 30, gives
// M(d) = 2^(b - base + 97), and the row group's factor 2^(base - 118) takes
// the place of NVFP4's global scale g_w in the epilogue (alpha = g_act * g_w).
// Blocks whose codes are all zero get d = 0 whatever their byte.
//
// Why every product is exact. The fragment layout's code patterns are
// value(q) * 2^-126 (fragment_layout.hpp); one BF16 multiply by M(d) gives
//   NVFP4: value(q) * s * 2^-20       MXFP4: value(q) * 2^(b - base - 29),
// both between 2^-30 and 2688 * 2^-20 or 12: normal BF16 numbers with at most
// 6 significant bits, so the multiply is exact; the epilogue multiplies the
// FP32 sum by kFragEpilogue = 2^20 and g_w, giving value(q) * s * g_w and
// value(q) * 2^(b - 127). The tile layout's table holds T(d) = M(d) * 2^-106
// (NVFP4: s itself; MXFP4: 2^(b - base - 9)), multiplied with value(q).
// MXFP4 experts the window cannot hold (a row group whose non-zero blocks
// span more than 31 binades, or whose smallest byte exceeds 0xE1, where
// 2^(base - 118) * 2^20 overflows FP32's epilogue product) are refused at
// upload, naming the expert, the row and the byte.
#pragma once

#include <cstdint>

#include "cuda/layout/projection.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cuda {

constexpr uint32_t kScaleExponentBias = 223u;                     // exponent field of M(d) for d >> 3 == 0
constexpr uint32_t kScaleBiasBf16x2 = (kScaleExponentBias << 7) * 0x00010001u;
constexpr float kFragScaleBoost = 0x1p106f;  // NVFP4: M(d) = s * kFragScaleBoost
constexpr float kFragEpilogue = 0x1p20f;     // 2^126 / kFragScaleBoost: the fragment kernels' epilogue factor
constexpr int kMxfp4Window = 31;             // MXFP4: binades a row group's non-zero blocks may span, plus one
constexpr int kMxfp4MaxBase = 0xE1;          // MXFP4: the largest smallest byte of a row group
constexpr int kMxfp4FactorShift = 118;       // MXFP4: the row group's factor is 2^(base - 118)

// M(d) in both halves of a BF16x2 word: one multiply-add (d < 256). The
// kernels' conversion of a multiplier byte, also run by the host tests.
NVFP4_HD uint32_t scale_multiplier_bf16x2(uint32_t d) { return d * 0x00100010u + kScaleBiasBf16x2; }

// M(d) as a float (host tests and the tile table).
NVFP4_HD float scale_multiplier_value(uint32_t d) {
  return fmt::bits_to_float((scale_multiplier_bf16x2(d) & 0xffffu) << 16);
}

// The tile layout's table entry T(d) = M(d) * 2^-106 (0 for d = 0).
NVFP4_HD float tile_scale_value(uint32_t d) { return d == 0 ? 0.0f : scale_multiplier_value(d) * 0x1p-106f; }

// NVFP4: UE4M3 scale byte (non-negative, not NaN) -> d.
NVFP4_HD uint8_t nvfp4_multiplier_byte(uint8_t s) {
  const float v = fmt::e4m3_value(s);
  if (v == 0.0f) return 0;
  const uint32_t u = fmt::float_to_bits(v);  // a normal FP32 number with at most 4 significant bits
  const int e = int((u >> 23) & 0xffu) - 127;
  return uint8_t(((e + 10) << 3) | ((u >> 20) & 7u));
}

// The inverse of nvfp4_multiplier_byte (d = 0 -> byte 0).
NVFP4_HD uint8_t nvfp4_scale_byte(uint8_t d) {
  return d == 0 ? uint8_t(0) : fmt::e4m3_from_float(scale_multiplier_value(d) * 0x1p-106f);
}

// MXFP4: UE8M0 byte b of a row group whose base is `base` -> d (b - base in [0, 30]).
NVFP4_HD uint8_t mxfp4_multiplier_byte(uint8_t b, int base) { return uint8_t((int(b) - base + 1) << 3); }
// The inverse (d > 0).
NVFP4_HD uint8_t mxfp4_scale_byte(uint8_t d, int base) { return uint8_t(int(d >> 3) - 1 + base); }
// The factor of a row group in place of g_w: 2^(base - 118).
NVFP4_HD float mxfp4_row_group_factor(int base) {
  return fmt::bits_to_float(uint32_t(base - kMxfp4FactorShift + 127) << 23);
}

// One expert's projection in the linear layout of ExpertWeights.
struct LinearExpertProjection {
  ExpertFormat format = ExpertFormat::Nvfp4;
  Projection projection = Projection::GateUp;
  int64_t hidden = 0, inter = 0;
  const uint8_t* codes = nullptr;   // [N, K/2]
  const uint8_t* scales = nullptr;  // [N, K/16] UE4M3 or [N, K/32] UE8M0
  int64_t expert = 0;               // global id, for messages
};

// Multiplier bytes [N, K/16] and codes [N, K/2] (those of zero blocks
// cleared) of one expert's projection; MXFP4: the factors of its row groups
// (GateUp: gate, up; Down: one) into mx_factors, NVFP4 leaves it alone.
// Throws for an MXFP4 row group outside the window, naming the expert, the
// row, the block and the byte.
void encode_weight_scales(const LinearExpertProjection& w, uint8_t* codes, uint8_t* multipliers, float* mx_factors);

// The inverse for tests: linear scales (the format's bytes; zero blocks come
// back as 0x00 for NVFP4 and as the row group's base for MXFP4) from
// multiplier bytes and, for MXFP4, the row groups' factors.
void decode_weight_scales(ExpertFormat f, Projection p, int64_t hidden, int64_t inter, const uint8_t* multipliers,
                          const float* mx_factors, uint8_t* scales);

}  // namespace nvfp4moe::cuda
