// Quantization: hand-worked golden vectors, the pitfalls, fast vs reference
// bit equality on fresh random inputs, and the QDQ fixed point.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

using namespace nvfp4moe;
using nvfp4moe::test::Rng;

TEST(Quantize, GoldenBlockWorkedByHand) {
  // g = 1 (static). amax = 6 -> s = e4m3(6/6 / 1) = 1.0 = 0x38, d = 1.
  const float x[16] = {6, -6, 3, 0.1f, -0.1f, 1.25f, 1.75f, 0.25f, 0.75f, 2.5f, 3.5f, 5, 4, -2, 1, 0};
  // codes: 7 F 5 0 8 2 4 0 2 4 6 6 6 C 2 0 ; packed low nibble first
  const uint8_t want_codes[8] = {0xF7, 0x05, 0x28, 0x04, 0x42, 0x66, 0xC6, 0x02};
  float g = 1.0f;
  uint8_t codes[8], scale;
  quantize_rows(x, 1, 16, 16, &g, 0, codes, &scale);
  EXPECT_EQ(scale, 0x38);
  EXPECT_BYTES_EQ(codes, want_codes, 8, "golden codes");
  quantize_rows_ref(x, 1, 16, 16, &g, 0, codes, &scale);
  EXPECT_EQ(scale, 0x38);
  EXPECT_BYTES_EQ(codes, want_codes, 8, "golden codes (ref)");
}

TEST(Quantize, GoldenPerTensorScaleWorkedByHand) {
  // One block, amax 3 over the tensor: g = 3/2688; s = e4m3((3/6)/g) = e4m3(448) = 0x7E;
  // d = 448*g = 0.5; x/d: 3->6 (7), 1.5->3 (5), -0.2->-0.4 (0x9), 0.7->1.4 (3).
  float x[16] = {3, 1.5f, -0.2f, 0.7f};
  Nvfp4Matrix m = quantize_matrix(x, 1, 16, ScaleScope::PerTensor);
  ASSERT_EQ(m.global_scale.size(), 1u);
  EXPECT_EQ(m.global_scale[0], 3.0f / 2688.0f);
  EXPECT_EQ(m.scales[0], 0x7E);
  EXPECT_EQ(m.codes[0], 0x57);
  EXPECT_EQ(m.codes[1], 0x39);
  for (int i = 2; i < 8; ++i) EXPECT_EQ(m.codes[i], 0) << i;
}

TEST(Quantize, BlockScaleIsAmaxOverSixNotAmax) {
  // Pitfall: amax 6 with g = 1 must give scale 1.0 (0x38), not 6.0 (0x4C).
  float x[16] = {};
  x[3] = 6.0f;
  float g = 1.0f;
  uint8_t codes[8], scale;
  quantize_rows(x, 1, 16, 16, &g, 0, codes, &scale);
  EXPECT_EQ(scale, 0x38);
  EXPECT_NE(scale, e4m3_encode(6.0f));
  EXPECT_EQ(codes[1], 0x70);  // element 3: high nibble, code 7 (=6)
}

TEST(Quantize, LargeActivationsNeedTheGlobalScale) {
  // Pitfall: without g, block scales of amax 1e4 overflow UE4M3 (saturate at
  // 448 -> max representable 2688). With the per-row g they stay in range.
  const uint64_t seed = nvfp4moe::test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  std::vector<float> x = nvfp4moe::test::random_normal(rng, 4 * 64, 3000.0f);
  // x[5] must be its row's (and block's) amax for the exact check below: a
  // 3.3-sigma draw elsewhere in row 0 (about 1 run in 16) would take its place.
  for (float& v : x) v = std::max(-9000.0f, std::min(9000.0f, v));
  x[5] = 10000.0f;
  Nvfp4Matrix m = quantize_matrix(x.data(), 4, 64, ScaleScope::PerRow);
  for (uint8_t s : m.scales) EXPECT_LE(s, 0x7E);
  std::vector<float> back = dequantize(m);
  EXPECT_LT(nvfp4moe::test::rel_l2(back, x), 0.15);
  EXPECT_NEAR(back[5], 10000.0f, 1.0f);
  // The same data with g = 1 loses the large values: that is the bug.
  Nvfp4Matrix bad = quantize_matrix(x.data(), 4, 64, ScaleScope::Static, 1.0f);
  EXPECT_GT(nvfp4moe::test::rel_l2(dequantize(bad), x), 0.3);
}

TEST(Quantize, FastEqualsReferenceOnFreshRandomInputs) {
  uint64_t seed = nvfp4moe::test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  for (int64_t cols : {16, 48, 256, 7168}) {
    int64_t rows = 37;
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (auto& v : x) {
      double r = rng.uniform();
      // mix of magnitudes, exact ties, zeros and tiny values
      v = r < 0.1 ? 0.0f : r < 0.2 ? float(rng.below(13)) * 0.25f * (rng.uniform() < 0.5 ? -1 : 1)
          : r < 0.3 ? rng.normal() * 1e-20f : rng.normal() * float(std::pow(10.0, rng.uniform(-4, 4)));
    }
    for (ScaleScope scope : {ScaleScope::PerTensor, ScaleScope::PerRow, ScaleScope::Static}) {
      Nvfp4Matrix m = quantize_matrix(x.data(), rows, cols, scope, 0.37f);
      std::vector<uint8_t> codes(m.codes.size()), scales(m.scales.size());
      quantize_rows_ref(x.data(), rows, cols, cols, m.global_scale.data(),
                        m.global_scale.size() == 1 ? 0 : 1, codes.data(), scales.data());
      EXPECT_BYTES_EQ(m.codes.data(), codes.data(), int64_t(codes.size()),
                      "codes cols=" << cols << " scope " << scope_name(scope));
      EXPECT_BYTES_EQ(m.scales.data(), scales.data(), int64_t(scales.size()),
                      "scales cols=" << cols << " scope " << scope_name(scope));
    }
  }
}

TEST(Quantize, Bf16InputMatchesFloatInput) {
  Rng rng(nvfp4moe::test::fresh_seed());
  std::vector<float> x = nvfp4moe::test::random_normal(rng, 8 * 128, 2.0f);
  std::vector<Bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = bf16_from_float(x[i]);
    x[i] = bf16_to_float(xb[i]);
  }
  Nvfp4Matrix a = quantize_matrix(x.data(), 8, 128, ScaleScope::PerRow);
  Nvfp4Matrix b = quantize_matrix(xb.data(), 8, 128, ScaleScope::PerRow);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
  EXPECT_EQ(a.global_scale, b.global_scale);
}

TEST(Quantize, QuantizeDequantizeIsAFixedPoint) {
  Rng rng(nvfp4moe::test::fresh_seed());
  std::vector<float> x = nvfp4moe::test::random_normal(rng, 16 * 512, 1.0f);
  for (ScaleScope scope : {ScaleScope::PerTensor, ScaleScope::PerRow}) {
    Nvfp4Matrix m = quantize_matrix(x.data(), 16, 512, scope);
    std::vector<float> once = dequantize(m);
    Nvfp4Matrix m2 = quantize_matrix(once.data(), 16, 512, scope);
    std::vector<float> twice = dequantize(m2);
    EXPECT_EQ(once, twice) << scope_name(scope);
    EXPECT_EQ(m.global_scale, m2.global_scale) << scope_name(scope);
  }
}

// ModelOpt formula: an all-zero block now has scale byte 0x38 (1.0, so d_b =
// g), where (amax_b / 6) / g gave 0x00; its codes stay 0, -0 included (the
// sign bit is set only for x < 0).
TEST(Quantize, ZeroBlocksGetScaleOneAndZeroCodes) {
  std::vector<float> x(64, 0.0f);
  x[40] = -1.0f;
  for (int i = 48; i < 64; ++i) x[size_t(i)] = -0.0f;
  Nvfp4Matrix m = quantize_matrix(x.data(), 1, 64, ScaleScope::PerRow);
  EXPECT_EQ(m.scales[0], 0x38);
  EXPECT_EQ(m.scales[1], 0x38);
  EXPECT_EQ(m.scales[2], 0x7E);  // amax 1 = the row's: t = 1 / f32(6 / 2688) = 448
  EXPECT_EQ(m.scales[3], 0x38);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(m.codes[size_t(i)], 0) << i;
  for (int i = 24; i < 32; ++i) EXPECT_EQ(m.codes[size_t(i)], 0) << i;
  std::vector<float> back = dequantize(m);
  EXPECT_EQ(back[40], -1.0f);
  for (int i = 0; i < 64; ++i) {
    if (i != 40) {
      EXPECT_EQ(back[size_t(i)], 0.0f) << i;
    }
  }
}

// One block of 16 through every quantizer of the host — quantize_rows,
// quantize_rows_ref and quantize_matrix (static g) — against the expected
// scale byte and 8 code bytes.
void expect_block(const float (&x)[16], float g, uint8_t want_scale, const uint8_t (&want_codes)[8],
                  const char* what) {
  SCOPED_TRACE(what);
  uint8_t codes[8], scale;
  quantize_rows(x, 1, 16, 16, &g, 0, codes, &scale);
  EXPECT_EQ(int(scale), int(want_scale)) << "quantize_rows";
  EXPECT_BYTES_EQ(codes, want_codes, 8, "codes (quantize_rows)");
  quantize_rows_ref(x, 1, 16, 16, &g, 0, codes, &scale);
  EXPECT_EQ(int(scale), int(want_scale)) << "quantize_rows_ref";
  EXPECT_BYTES_EQ(codes, want_codes, 8, "codes (quantize_rows_ref)");
  const Nvfp4Matrix m = quantize_matrix(x, 1, 16, ScaleScope::Static, g);
  EXPECT_EQ(int(m.scales[0]), int(want_scale)) << "quantize_matrix";
  EXPECT_BYTES_EQ(m.codes.data(), want_codes, 8, "codes (quantize_matrix)");
}

// The golden blocks below were computed independently by
// tests/python/spec_ref.py (NumPy, FP32), and by hand as noted.

// A block whose t = amax_b / f32(6 g) is below 2^-9 is clamped to the
// smallest E4M3 value, byte 0x01 (2^-9): RN alone would give 0x00 for t <=
// 2^-10 (d_b = 0). The codes are then those of x / (2^-9 * g). Here g = 1,
// t = 2^-12, d = 2^-9: x / d = 0.75 (tie: code 2), -0.75, 0.125 (0), 0.375
// (1), -0.375 (9), 0.5625 (1), 0.9375 (2), 0.
TEST(Quantize, GoldenTinyBlockIsClampedToTheSmallestScale) {
  const float u = 0x1p-12f;
  const float x[16] = {6 * u, -6 * u, u, 3 * u, -3 * u, 4.5f * u, 7.5f * u};
  const uint8_t want[8] = {0xA2, 0x10, 0x19, 0x02, 0, 0, 0, 0};
  expect_block(x, 1.0f, 0x01, want, "t = 2^-12");
  // t = 2^-10, RN's tie between 0x00 and 0x01 (to 0x00), is clamped too: x / 2^-9 = 3, code 5.
  const float tie[16] = {6 * 0x1p-10f};
  const uint8_t tie_codes[8] = {0x05};
  expect_block(tie, 1.0f, 0x01, tie_codes, "t = 2^-10");
}

// A block whose t is above 448 (a static g smaller than the block needs)
// saturates at byte 0x7E (448): g = 1, amax 6000, d = 448; x / d = 13.4 (7),
// -13.4 (F), 3 (5), -3 (D), 2.5 (tie: 4), 0.25 (tie: 0), 0.3 (1), 0.
TEST(Quantize, GoldenLargeBlockSaturatesAt448) {
  const float x[16] = {6000, -6000, 1344, -1344, 1120, 112, 134.4f, 0};
  const uint8_t want[8] = {0xF7, 0xD5, 0x04, 0x01, 0, 0, 0, 0};
  expect_block(x, 1.0f, 0x7E, want, "t = 1000");
}

// Pitfall: scale bytes are bit patterns. amax 11.25 under g = 1 gives t =
// 1.875, byte 0x3F — the E4M3 value 1.875, not 63 — and x / 1.875: 6 (7),
// -6 (F), 1 (2), 0.5 (1), 3 (5), -2 (C).
TEST(Quantize, GoldenScaleByte3FIsOnePoint875) {
  const float x[16] = {11.25f, -11.25f, 1.875f, 0.9375f, 5.625f, -3.75f};
  const uint8_t want[8] = {0xF7, 0x12, 0xC5, 0, 0, 0, 0, 0};
  expect_block(x, 1.0f, 0x3F, want, "t = 1.875");
  Nvfp4Matrix m = quantize_matrix(x, 1, 16, ScaleScope::Static, 1.0f);
  const std::vector<float> back = dequantize(m);
  EXPECT_EQ(back[0], 11.25f);  // value(7) * 1.875 * 1: 63 would give 378
  EXPECT_EQ(back[5], -3.75f);
}

// ModelOpt formula: 6 * g is rounded to FP32 before the one division, so
// amax_b / f32(6 g) and the former (amax_b / 6) / g differ by an ulp near
// E4M3 rounding boundaries, and then in the byte. A row whose maximum is 10
// (g = f32(10 / 2688), f32(6 g) != 6 g) and whose block 1 has maximum
// 0x1.e00002p-4: t = 0x1.5p+2 = 5.25 exactly, the tie between 5 and 5.5, to
// the even byte 0x4A (5.0); (amax / 6) / g = 0x1.500002p+2 would give 0x4B
// (5.5). The codes follow d = 5 g: 0x1.8c30c2p-5 / d = 2.6 gives code 5,
// where d = 5.5 g would give 4.
TEST(Quantize, GoldenSixGIsRoundedBeforeTheDivision) {
  std::vector<float> x(32, 0.0f);
  x[0] = 10.0f;
  for (int i = 1; i < 16; ++i) x[size_t(i)] = 1.0f;
  x[16] = 0x1.e00002p-4f;
  x[17] = -0x1.e00002p-4f;
  x[18] = 0x1.8c30c2p-5f;
  const Nvfp4Matrix m = quantize_matrix(x.data(), 1, 32, ScaleScope::PerRow);
  const float g = 10.0f / 2688.0f;
  ASSERT_EQ(m.global_scale[0], g);
  ASSERT_NE(double(6.0f * g), 6.0 * double(g)) << "the example needs f32(6 g) != 6 g";
  EXPECT_EQ(m.scales[0], 0x7E);
  EXPECT_EQ(m.scales[1], 0x4A);
  EXPECT_EQ(e4m3_encode((x[16] / 6.0f) / g), 0x4B) << "the former formula gives another byte here";
  const uint8_t want[16] = {0x17, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0xF7, 0x05, 0, 0, 0, 0, 0, 0};
  EXPECT_BYTES_EQ(m.codes.data(), want, 16, "codes");
  uint8_t codes[16], scales[2];
  quantize_rows_ref(x.data(), 1, 32, 32, &g, 0, codes, scales);
  EXPECT_EQ(scales[1], 0x4A);
  EXPECT_BYTES_EQ(codes, want, 16, "codes (quantize_rows_ref)");
}

TEST(Quantize, NaNInAnActivationRowPoisonsOnlyThatRow) {
  std::vector<float> x(3 * 32, 0.5f);
  x[32 + 7] = std::numeric_limits<float>::quiet_NaN();
  x[64 + 20] = std::numeric_limits<float>::infinity();
  Nvfp4Matrix m = quantize_matrix(x.data(), 3, 32, ScaleScope::PerRow);
  EXPECT_EQ(m.scales[0], m.scales[1]);
  EXPECT_NE(m.scales[0], 0x7F);
  for (int b = 2; b < 6; ++b) EXPECT_EQ(m.scales[size_t(b)], 0x7F) << "block " << b;
  std::vector<float> back = dequantize(m);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(back[size_t(i)], 0.5f);
  for (int i = 32; i < 96; ++i) EXPECT_TRUE(std::isnan(back[size_t(i)])) << i;
}

// Under a static g a NaN or Inf element marks its own block NaN (0x7F, codes
// 0) — an Inf is not clamped to a finite 448 — and leaves the others alone.
TEST(Quantize, NaNOrInfUnderAStaticScaleMarksItsBlock) {
  std::vector<float> x(48, 0.5f);
  x[3] = INFINITY;
  x[40] = std::nanf("");
  const Nvfp4Matrix m = quantize_matrix(x.data(), 1, 48, ScaleScope::Static, 1.0f);
  EXPECT_EQ(m.scales[0], 0x7F);
  EXPECT_EQ(m.scales[1], e4m3_encode(0.5f / 6.0f));
  EXPECT_EQ(m.scales[2], 0x7F);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(m.codes[size_t(i)], 0) << i;
  for (int i = 16; i < 24; ++i) EXPECT_EQ(m.codes[size_t(i)], 0) << i;
}

TEST(Quantize, WeightsWithNaNAreRejectedNamingTheIndex) {
  std::vector<float> w(2 * 16, 1.0f);
  w[19] = std::numeric_limits<float>::quiet_NaN();
  try {
    quantize_matrix(w.data(), 2, 16, ScaleScope::PerTensor, 1.0f, true, "experts.0.up_proj.weight");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("experts.0.up_proj.weight"), std::string::npos) << msg;
    EXPECT_NE(msg.find("19"), std::string::npos) << msg;
  }
}

TEST(Quantize, KNotAMultipleOf16IsAnError) {
  std::vector<float> x(20, 1.0f);
  EXPECT_THROW(quantize_matrix(x.data(), 1, 20, ScaleScope::PerRow), Error);
  float g = 1.0f;
  uint8_t c[16], s[2];
  EXPECT_THROW(quantize_rows(x.data(), 1, 20, 20, &g, 0, c, s), Error);
}

TEST(Quantize, StaticScaleMustBeFinitePositive) {
  std::vector<float> x(16, 1.0f);
  EXPECT_THROW(quantize_matrix(x.data(), 1, 16, ScaleScope::Static, std::nanf("")), Error);
  EXPECT_THROW(quantize_matrix(x.data(), 1, 16, ScaleScope::Static, 0.0f), Error);
}
