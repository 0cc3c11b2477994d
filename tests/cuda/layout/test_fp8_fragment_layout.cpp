// The FP8 shared expert's fragment layout (host code, runs without a GPU):
// hand-checked offsets, every element at its offset on odd geometries, and
// padding bytes zero.
#include <gtest/gtest.h>

#include <set>

#include "cuda/layout/fp8_fragment_layout.hpp"
#include "nvfp4moe/error.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

TEST(Fp8FragmentLayout, HandCheckedOffsets) {
  // Gate/up, Is = 16, H = 128: gate row 9 is m-tile 1, lane row 1; column 70
  // is chunk 1, lane quad 0, byte 6. Its up row (Is + 9) is the hi piece.
  const Fp8FragmentGeometry gu{.rows = 32, .cols = 128, .pairs = true};
  EXPECT_EQ(gu.m_tiles(), 2);
  EXPECT_EQ(fp8_fragment_offset(gu, 9, 70), 2048 + ((1 * 2 + 0) * 32 + 4) * 16 + 6);
  EXPECT_EQ(fp8_fragment_offset(gu, 16 + 9, 70), 2048 + ((1 * 2 + 1) * 32 + 4) * 16 + 6);
  // Down, H = 32 rows, Is = 256: row 29 is m-tile 1, hi piece, lane row 5;
  // column 150 is K tile 1, chunk 0, lane quad 1, byte 6.
  const Fp8FragmentGeometry dn{.rows = 32, .cols = 256, .pairs = false};
  EXPECT_EQ(fp8_fragment_offset(dn, 29, 150), (1 * 2 + 1) * 2048 + ((0 * 2 + 1) * 32 + 5 * 4 + 1) * 16 + 6);
  // Blocks: groups of 4 m-tiles, K-tile-major within a group. Down, 80 rows
  // (5 m-tiles: a group of 4 and one of 1), 384 columns (3 K tiles): row 20
  // (m-tile 1, lo, lane row 4) at column 130 (K tile 1, chunk 0, quad 0,
  // byte 2) is block 1 * 4 + 1; row 70 (m-tile 4, the narrow group) at
  // column 300 (K tile 2, chunk 0, quad 2, byte 12) is block 4 * 3 + 2.
  const Fp8FragmentGeometry five{.rows = 80, .cols = 384, .pairs = false};
  EXPECT_EQ(fp8_fragment_block(5, 3, 1, 1), 5);
  EXPECT_EQ(fp8_fragment_block(5, 3, 4, 2), 14);
  EXPECT_EQ(fp8_fragment_offset(five, 20, 130), 5 * 2048 + ((0 * 2 + 0) * 32 + 4 * 4 + 0) * 16 + 2);
  EXPECT_EQ(fp8_fragment_offset(five, 70, 300), 14 * 2048 + ((0 * 2 + 0) * 32 + 6 * 4 + 2) * 16 + 12);
}

TEST(Fp8FragmentLayout, EveryElementAtItsOffsetPaddingZero) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  test::Rng rng(seed);
  for (const Fp8FragmentGeometry g : {Fp8FragmentGeometry{.rows = 2 * 208, .cols = 272, .pairs = true},
                                      Fp8FragmentGeometry{.rows = 272, .cols = 208, .pairs = false},
                                      Fp8FragmentGeometry{.rows = 2 * 8, .cols = 16, .pairs = true},
                                      Fp8FragmentGeometry{.rows = 40, .cols = 384, .pairs = false}}) {
    std::vector<uint8_t> w(size_t(g.rows * g.cols));
    for (auto& b : w) b = uint8_t(1 + rng.below(255));  // never zero, so padding shows
    const std::vector<uint8_t> f = fp8_fragments(w, g);
    ASSERT_EQ(int64_t(f.size()), g.bytes());
    std::set<int64_t> used;
    for (int64_t r = 0; r < g.rows; ++r)
      for (int64_t k = 0; k < g.cols; ++k) {
        const int64_t o = fp8_fragment_offset(g, r, k);
        ASSERT_TRUE(used.insert(o).second) << "two elements at offset " << o;
        ASSERT_EQ(f[size_t(o)], w[size_t(r * g.cols + k)]) << "row " << r << " col " << k;
      }
    for (int64_t o = 0; o < g.bytes(); ++o)
      if (!used.count(o)) ASSERT_EQ(f[size_t(o)], 0) << "padding byte " << o;
  }
}

TEST(Fp8FragmentLayout, RefusesShapesItCannotHold) {
  EXPECT_THROW(fp8_fragments(std::vector<uint8_t>(8 * 16), {.rows = 8, .cols = 16, .pairs = true}), Error);
  EXPECT_THROW(fp8_fragments(std::vector<uint8_t>(16 * 24), {.rows = 16, .cols = 24, .pairs = false}), Error);
  EXPECT_THROW(fp8_fragments(std::vector<uint8_t>(10), {.rows = 16, .cols = 16, .pairs = false}), Error);
}

}  // namespace
}  // namespace nvfp4moe::cuda
