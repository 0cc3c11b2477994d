#include <gtest/gtest.h>

#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

using namespace nvfp4moe;

TEST(Layout, SwizzledOffsetsWorkedByHand) {
  // kp = 4: one 512-byte tile per 128 rows.
  EXPECT_EQ(swizzled_offset(0, 0, 4), 0);
  EXPECT_EQ(swizzled_offset(0, 3, 4), 3);
  EXPECT_EQ(swizzled_offset(1, 0, 4), 16);
  EXPECT_EQ(swizzled_offset(32, 0, 4), 4);
  EXPECT_EQ(swizzled_offset(33, 2, 4), 16 + 4 + 2);
  EXPECT_EQ(swizzled_offset(127, 3, 4), 31 * 16 + 3 * 4 + 3);
  EXPECT_EQ(swizzled_offset(128, 0, 4), 512);
  // kp = 8: the second group of 4 columns is the next tile.
  EXPECT_EQ(swizzled_offset(0, 4, 8), 512);
  EXPECT_EQ(swizzled_offset(128, 0, 8), 1024);
}

TEST(Layout, RoundTripsAndZeroPads) {
  nvfp4moe::test::Rng rng(nvfp4moe::test::fresh_seed());
  for (auto [rows, k] : {std::pair<int64_t, int64_t>{1, 1}, {130, 5}, {256, 448}, {7, 192}}) {
    std::vector<uint8_t> lin(static_cast<size_t>(rows * k));
    for (auto& b : lin) b = uint8_t(1 + rng.below(254));  // non-zero so padding is distinguishable
    std::vector<uint8_t> swz(size_t(swizzled_scale_bytes(rows, k)), 0xAA);
    scales_linear_to_swizzled(lin.data(), rows, k, swz.data());
    int64_t nonzero = 0;
    for (uint8_t b : swz) nonzero += b != 0;
    EXPECT_EQ(nonzero, rows * k) << "padding must be zero rows=" << rows << " k=" << k;
    std::vector<uint8_t> back(lin.size(), 0);
    scales_swizzled_to_linear(swz.data(), rows, k, back.data());
    EXPECT_BYTES_EQ(back.data(), lin.data(), int64_t(lin.size()), "rows=" << rows << " k=" << k);
  }
}
