// Linear NVFP4 bytes <-> the fragment layout of sm90_nvfp4_decode_gemm
// (described in fragment_layout.hpp). Host code, run once at upload.
#include "cuda/layout/fragment_layout.hpp"

#include <cstring>

#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cuda {

namespace {

// Byte 0 of lane's scale word `word` of m-tile mt.
int64_t scale_byte(const FragmentGeometry& g, int64_t mt, int64_t word, int lane) {
  return ((mt * (g.k_chunks / kMmaScaleChunks) + word) * g.scale_lanes + scale_word_of_lane(g.scale_lanes, lane)) * 4;
}

// Logical K column of half h of register i in k-step s of lane t's chunk c.
int64_t source_col(int64_t c, int t, int s, int i, int h) {
  return c * kMmaChunkK + 16 * t + 4 * s + 2 * (i >> 1) + h;
}

// Visits every code: fn(linear row, linear col, word index, register i, half h)
// and every scale: gn(linear row, scale column, byte index).
template <typename CodeFn, typename ScaleFn>
void for_each_element(Projection p, int64_t hidden, int64_t inter, ExpertFormat f, CodeFn&& fn, ScaleFn&& gn) {
  const FragmentGeometry g = fragment_geometry(p, hidden, inter, f);
  for (int64_t mt = 0; mt < g.m_tiles; ++mt)
    for (int64_t c = 0; c < g.k_chunks; ++c)
      for (int lane = 0; lane < 32; ++lane) {
        const int gi = lane / 4, t = lane % 4;
        const int64_t word0 = ((mt * g.k_chunks + c) * 32 + lane) * 4;
        for (int s = 0; s < 4; ++s)
          for (int i = 0; i < 4; ++i)
            for (int h = 0; h < 2; ++h)
              fn(fragment_source_row(p, mt, gi + 8 * (i & 1), inter), source_col(c, t, s, i, h), word0 + s, i, h);
        const int64_t sbyte = scale_byte(g, mt, c / kMmaScaleChunks, lane) + 2 * (c % kMmaScaleChunks);
        for (int r = 0; r < 2; ++r)
          gn(fragment_source_row(p, mt, gi + 8 * r, inter), 4 * c + t, sbyte + r);
      }
}

}  // namespace

int64_t fragment_source_row(Projection p, int64_t mt, int r, int64_t inter) {
  if (p == Projection::Down) return mt * kMmaTileRows + r;
  const int64_t i = mt * 8 + (r % 8);
  return r < 8 ? i : inter + i;
}

bool fragment_layout_fits(int64_t hidden, int64_t inter) {
  const int64_t k = kMmaChunkK * kMmaScaleChunks;
  return hidden > 0 && inter > 0 && inter % 8 == 0 && hidden % k == 0 && inter % k == 0;
}

FragmentGeometry fragment_geometry(Projection p, int64_t hidden, int64_t inter, ExpertFormat format) {
  NVFP4_CHECK(hidden > 0 && inter > 0 && inter % 8 == 0 && hidden % 16 == 0,
              "mma layout: H must be a positive multiple of 16 and I of 8, got H=", hidden, " I=", inter);
  const int64_t rows = p == Projection::GateUp ? 2 * inter : hidden;
  const int64_t k = p == Projection::GateUp ? hidden : inter;
  NVFP4_CHECK(k % (kMmaChunkK * kMmaScaleChunks) == 0, "mma layout: K (", p == Projection::GateUp ? "H" : "I",
              ") must be a multiple of ", kMmaChunkK * kMmaScaleChunks, ", got ", k);
  return FragmentGeometry{rows / kMmaTileRows, k / kMmaChunkK, format == ExpertFormat::Mxfp4 ? 16 : 32};
}

void pack_fragment_weights(Projection p, const uint8_t* codes, const uint8_t* scales, int64_t hidden, int64_t inter,
                           uint8_t* out_codes, uint8_t* out_scales, ExpertFormat format) {
  // Word by word (the element-wise map of for_each_element, which
  // unpack_fragment_weights uses, is the reference; tests round-trip the two).
  const int64_t k = p == Projection::GateUp ? hidden : inter;
  const FragmentGeometry g = fragment_geometry(p, hidden, inter, format);
  uint32_t* words = reinterpret_cast<uint32_t*>(out_codes);  // little-endian host, as the device
  for (int64_t mt = 0; mt < g.m_tiles; ++mt)
    for (int gi = 0; gi < 8; ++gi) {
      const uint8_t* row_lo = codes + fragment_source_row(p, mt, gi, inter) * (k / 2);      // row g
      const uint8_t* row_hi = codes + fragment_source_row(p, mt, gi + 8, inter) * (k / 2);  // row g + 8
      for (int64_t c = 0; c < g.k_chunks; ++c)
        for (int t = 0; t < 4; ++t) {
          uint32_t* w = words + ((mt * g.k_chunks + c) * 32 + gi * 4 + t) * 4;
          const uint8_t* lo = row_lo + c * (kMmaChunkK / 2) + 8 * t;  // columns 64c + 16t .. + 15
          const uint8_t* hi = row_hi + c * (kMmaChunkK / 2) + 8 * t;
          for (int st = 0; st < 4; ++st) {
            // Register i: rows g, g+8, g, g+8; columns 4s + {0,1} (i < 2) or 4s + {2,3}.
            const uint8_t b[4] = {lo[2 * st], hi[2 * st], lo[2 * st + 1], hi[2 * st + 1]};
            uint8_t q[8];
            for (int i = 0; i < 4; ++i) {
              q[2 * i] = uint8_t(b[i] & 15u);
              q[2 * i + 1] = uint8_t(b[i] >> 4);
            }
            w[st] = pack_fragment_word(q);
          }
        }
    }
  // Scale word of lane (g, t) for chunks 2w, 2w + 1: byte 2j + r = row g + 8r, block 4(2w + j) + t
  // (MXFP4: lanes t = 2u and 2u + 1 write the same word, with the same bytes).
  const bool paired = g.scale_lanes != 32;
  for (int64_t mt = 0; mt < g.m_tiles; ++mt)
    for (int gi = 0; gi < 8; ++gi)
      for (int r = 0; r < 2; ++r) {
        const int64_t src_row = fragment_source_row(p, mt, gi + 8 * r, inter);
        const uint8_t* row = scales + src_row * (k / 16);
        for (int64_t wi = 0; wi < g.k_chunks / kMmaScaleChunks; ++wi)
          for (int t = 0; t < 4; ++t)
            for (int j = 0; j < kMmaScaleChunks; ++j) {
              const int64_t block = 4 * (kMmaScaleChunks * wi + j) + t;
              NVFP4_CHECK(!paired || t % 2 == 0 || row[block] == row[block - 1], "fragment layout (MXFP4): row ",
                          src_row, " blocks ", block - 1, " and ", block, " of one 32-column block carry bytes ",
                          int(row[block - 1]), " and ", int(row[block]));
              out_scales[scale_byte(g, mt, wi, gi * 4 + t) + 2 * j + r] = row[block];
            }
      }
}

void unpack_fragment_weights(Projection p, const uint8_t* packed_codes, const uint8_t* packed_scales, int64_t hidden,
                             int64_t inter, uint8_t* codes, uint8_t* scales, ExpertFormat format) {
  const int64_t k = p == Projection::GateUp ? hidden : inter;
  const int64_t rows = p == Projection::GateUp ? 2 * inter : hidden;
  std::memset(codes, 0, size_t(rows * k / 2));
  const uint32_t* words = reinterpret_cast<const uint32_t*>(packed_codes);
  for_each_element(
      p, hidden, inter, format,
      [&](int64_t row, int64_t col, int64_t word, int i, int h) {
        const uint32_t w = words[word];
        const uint32_t c = ((w >> (kFragMagBit[i] + 16 * h)) & 7u) | (((w >> (kFragSignBit[i] + 16 * h)) & 1u) << 3);
        codes[row * (k / 2) + col / 2] |= uint8_t((col & 1) ? c << 4 : c);
      },
      [&](int64_t row, int64_t scol, int64_t byte) { scales[row * (k / 16) + scol] = packed_scales[byte]; });
}

}  // namespace nvfp4moe::cuda
