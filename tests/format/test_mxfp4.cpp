// MXFP4 codec and dequantization against values written by hand from the
// format (docs/numerics.md §7): UE8M0 2^(b - 127), E2M1 sign-magnitude codes,
// element 2i in the low nibble, one scale per 32 elements.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

using namespace nvfp4moe;

TEST(Ue8m0, DecodesEveryByteAsAPowerOfTwo) {
  EXPECT_EQ(ue8m0_decode(127), 1.0f);
  EXPECT_EQ(ue8m0_decode(128), 2.0f);
  EXPECT_EQ(ue8m0_decode(126), 0.5f);
  EXPECT_EQ(ue8m0_decode(118), 0x1p-9f);
  EXPECT_EQ(ue8m0_decode(1), 0x1p-126f);
  EXPECT_EQ(ue8m0_decode(0), 0x1p-127f);  // an FP32 subnormal, not zero
  EXPECT_EQ(ue8m0_decode(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(ue8m0_decode(0xFF)));
  for (int b = 0; b < 255; ++b) EXPECT_EQ(double(ue8m0_decode(uint8_t(b))), std::ldexp(1.0, b - 127)) << "byte " << b;
}

TEST(Mxfp4, DequantizesHandWrittenBlocks) {
  // Two rows of 32 elements. Row 0, scale 126 (0.5): byte 0 = 0x21 holds
  // element 0 = code 1 (0.5) and element 1 = code 2 (1.0); byte 15 = 0xF7
  // holds element 30 = code 7 (6) and element 31 = code 0xF (-6).
  // Row 1, scale 130 (8): byte 0 = 0x98 holds element 0 = code 8 (-0) and
  // element 1 = code 9 (-0.5); byte 1 = 0x5B holds element 2 = code 0xB (-1.5)
  // and element 3 = code 5 (3).
  std::vector<uint8_t> codes(32, 0), scales = {126, 130};
  codes[0] = 0x21;
  codes[15] = 0xF7;
  codes[16] = 0x98;
  codes[17] = 0x5B;
  std::vector<float> out(64, -1.0f);
  dequantize_mxfp4_rows(codes.data(), scales.data(), 2, 32, out.data());
  EXPECT_EQ(out[0], 0.25f);
  EXPECT_EQ(out[1], 0.5f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_EQ(out[30], 3.0f);
  EXPECT_EQ(out[31], -3.0f);
  EXPECT_EQ(out[32], 0.0f);
  EXPECT_TRUE(std::signbit(out[32]));  // code 8 is a negative zero
  EXPECT_EQ(out[33], -4.0f);
  EXPECT_EQ(out[34], -12.0f);
  EXPECT_EQ(out[35], 24.0f);
  EXPECT_EQ(out[36], 0.0f);
}

TEST(Mxfp4, Bf16DequantizationIsExact) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const int64_t R = 7, K = 96;
  Mxfp4Matrix m{R, K, std::vector<uint8_t>(size_t(R * K / 2)), std::vector<uint8_t>(size_t(R * K / 32))};
  for (auto& b : m.codes) b = uint8_t(rng.next());
  for (auto& s : m.scales) s = uint8_t(rng.below(253));  // every finite byte, 2^-127 .. 2^125
  const std::vector<float> f = dequantize(m);
  std::vector<Bf16> b(size_t(R * K));
  dequantize_mxfp4_rows(m.codes.data(), m.scales.data(), R, K, b.data());
  for (int64_t i = 0; i < R * K; ++i) {
    const int64_t r = i / K, c = i % K;
    const uint8_t code = uint8_t((m.codes[size_t(r * K / 2 + c / 2)] >> (4 * (c & 1))) & 15);
    const double want = double(e2m1_decode(code)) * std::ldexp(1.0, m.scales[size_t(r * K / 32 + c / 32)] - 127);
    ASSERT_EQ(double(f[size_t(i)]), want) << "element " << i;
    ASSERT_EQ(bf16_to_float(b[size_t(i)]), f[size_t(i)]) << "element " << i;
  }
}

TEST(Mxfp4, ScaleChecksNameRowBlockAndByte) {
  std::vector<uint8_t> s(3 * 2, 120);
  EXPECT_NO_THROW(check_mxfp4_scales(s.data(), 3, 64, "w"));
  s[3] = 0xFC;  // 6 * 2^125 is finite
  EXPECT_NO_THROW(check_mxfp4_scales(s.data(), 3, 64, "w"));
  s[3] = 0xFF;
  EXPECT_ERROR_CONTAINS(check_mxfp4_scales(s.data(), 3, 64, "w"), "w: UE8M0 scale of row 1, block 1",
                        "NaN byte 0xff");
  s[3] = 0xFD;
  EXPECT_ERROR_CONTAINS(check_mxfp4_scales(s.data(), 3, 64, "w"), "row 1, block 1 is 0xfd (2^126)", "overflow");
  EXPECT_ERROR_CONTAINS(check_mxfp4_scales(s.data(), 3, 48, "w"), "multiple of 32", "48");
}
