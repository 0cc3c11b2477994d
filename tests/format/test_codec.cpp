// Exhaustive codec tests: every E4M3 byte, every E2M1 code, every rounding
// threshold and tie of docs/numerics.md §1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "nvfp4moe/format.hpp"

using namespace nvfp4moe;

namespace {
// Independent E4M3 decode written from the format description with ldexp.
double e4m3_expected(int b) {
  int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return std::numeric_limits<double>::quiet_NaN();
  double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return s ? -mag : mag;
}
}  // namespace

TEST(E4M3, DecodesAll256BitPatterns) {
  for (int b = 0; b < 256; ++b) {
    double want = e4m3_expected(b);
    float got = e4m3_decode(uint8_t(b));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << "byte 0x" << std::hex << b;
    } else {
      EXPECT_EQ(double(got), want) << "byte 0x" << std::hex << b;
    }
  }
}

TEST(E4M3, ScaleBytesAreBitPatternsNotIntegers) {
  // Pitfall: 0x3F is E4M3 1.875, not 63.
  EXPECT_EQ(e4m3_decode(0x3F), 1.875f);
  EXPECT_EQ(e4m3_decode(0x38), 1.0f);
  EXPECT_EQ(e4m3_decode(0x7E), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), 0x1p-9f);
  EXPECT_EQ(e4m3_decode(0x08), 0x1p-6f);
  EXPECT_TRUE(std::isnan(e4m3_decode(0x7F)));
}

TEST(E4M3, EncodeRoundTripsEveryFiniteByte) {
  for (int b = 0; b < 256; ++b) {
    if ((b & 0x7F) == 0x7F) continue;
    float v = e4m3_decode(uint8_t(b));
    uint8_t back = e4m3_encode(v);
    if (b == 0x80) {  // -0 keeps its sign bit
      EXPECT_EQ(back, 0x80);
      continue;
    }
    EXPECT_EQ(back, b) << "value " << v;
  }
}

TEST(E4M3, RoundsToNearestEvenBetweenNeighbours) {
  for (int b = 0; b < 0x7E; ++b) {
    double lo = e4m3_expected(b), hi = e4m3_expected(b + 1);
    float mid = float((lo + hi) / 2);  // exact in float
    ASSERT_EQ(double(mid), (lo + hi) / 2);
    int even = (b & 1) ? b + 1 : b;
    EXPECT_EQ(e4m3_encode(mid), even) << "tie between 0x" << std::hex << b << " and 0x" << b + 1;
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 0.0f)), b) << "below tie, byte 0x" << std::hex << b;
    EXPECT_EQ(e4m3_encode(std::nextafter(mid, 1e9f)), b + 1) << "above tie, byte 0x" << std::hex << b;
  }
}

TEST(E4M3, SaturatesAndMapsNonFiniteToNaN) {
  EXPECT_EQ(e4m3_encode(448.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(463.9f), 0x7E);
  EXPECT_EQ(e4m3_encode(464.0f), 0x7E);
  EXPECT_EQ(e4m3_encode(1e30f), 0x7E);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::infinity()), 0x7F);
  EXPECT_EQ(e4m3_encode(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(e4m3_encode(0x1p-10f), 0x00);               // tie between 0 and 2^-9 -> even (0)
  EXPECT_EQ(e4m3_encode(std::nextafter(0x1p-10f, 1.0f)), 0x01);
  EXPECT_EQ(e4m3_encode(0x1p-30f), 0x00);
}

TEST(E2M1, DecodesAll16CodesSignMagnitude) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; ++c) {
    float want = (c & 8) ? -mags[c & 7] : mags[c & 7];
    EXPECT_EQ(e2m1_decode(uint8_t(c)), want) << "code " << c;
  }
  // Pitfall: codes 8..15 are NEGATIVE values, not 8..15 of a 0..15 range.
  for (int c = 9; c < 16; ++c) EXPECT_LT(e2m1_decode(uint8_t(c)), 0.0f) << "code " << c;
}

TEST(E2M1, ThresholdsAndTiesToEvenCode) {
  struct Case { float v; uint8_t code; };
  const Case cases[] = {
      {0.0f, 0}, {0.25f, 0}, {0.2500001f, 1}, {0.5f, 1}, {0.7499999f, 1}, {0.75f, 2},
      {1.0f, 2}, {1.25f, 2}, {1.2500001f, 3}, {1.5f, 3}, {1.7499999f, 3}, {1.75f, 4},
      {2.0f, 4}, {2.5f, 4}, {2.5000002f, 5}, {3.0f, 5}, {3.4999998f, 5}, {3.5f, 6},
      {4.0f, 6}, {5.0f, 6}, {5.0000005f, 7}, {6.0f, 7}, {100.0f, 7}, {1e30f, 7},
  };
  for (const auto& c : cases) {
    EXPECT_EQ(e2m1_encode(c.v), c.code) << "v=" << c.v;
    EXPECT_EQ(e2m1_encode(-c.v), c.v == 0.0f ? 0 : (c.code | 8)) << "v=" << -c.v;
  }
}

TEST(E2M1, NegativeValuesThatRoundToZeroKeepTheSign) {
  EXPECT_EQ(e2m1_encode(-0.1f), 0x8);
  EXPECT_EQ(e2m1_encode(-0.25f), 0x8);
  EXPECT_EQ(e2m1_encode(0.1f), 0x0);
}

TEST(E2M1, SnapsToNearestValueNotAUniformGrid) {
  // Pitfall: a uniform 0.5 grid would give 2.5 for 2.6 and 5.0 for 5.1.
  EXPECT_EQ(e2m1_decode(e2m1_encode(2.6f)), 3.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(5.1f)), 6.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(3.4f)), 3.0f);
  EXPECT_EQ(e2m1_decode(e2m1_encode(4.9f)), 4.0f);
}

TEST(GlobalScale, IsAmaxOver2688AndOneForZero) {
  EXPECT_EQ(global_scale_for_amax(2688.0f), 1.0f);
  EXPECT_EQ(global_scale_for_amax(0.0f), 1.0f);
  EXPECT_EQ(global_scale_for_amax(10.0f), 10.0f / 2688.0f);
}
