// DeepSeek's FP8 activation quantizer for its FP4 experts (docs/numerics.md
// §7; act_quant in DeepSeek-V4's inference/kernel.py with block_size 128 and
// scale_fmt "ue8m0"), bit for bit against vectors derived by hand from
//   s = 2^ceil(log2(f32(max(amax, 1e-4) * f32(1/448)))),  q = e4m3(clamp(x / s, -448, 448)).
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "cpu/cpu_moe.hpp"
#include "format/mxfp4_codec.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cpu {
namespace {

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
};
Quantized quant(const std::vector<float>& x) {
  Quantized q{std::vector<uint8_t>(x.size()), std::vector<float>((x.size() + 127) / 128)};
  fp8_act_quant_ref(x.data(), int64_t(x.size()), q.codes.data(), q.scales.data());
  return q;
}

TEST(Fp8ActQuant, GoldenBlocks) {
  // Block 0: amax 448. f32(1/448) = f32(1/7) * 2^-6 and 7 * f32(1/7) =
  // 1 + 4.5e-8 rounds to 1.0f: t = 1, s = 1. 448 -> 0x7E, 1 -> 0x38,
  // -3 = -1.5 * 2^1 -> 1 1000 100 = 0xC4, 0.3 -> 0.3 between E4M3 0.28125
  // (0x29) and 0.3125 (0x2A), nearer 0.3125 -> 0x2A.
  std::vector<float> x(384, 0.0f);
  x[0] = 448.0f, x[1] = 1.0f, x[2] = -3.0f, x[3] = 0.3f;
  // Block 1: amax 449: t = 449 * f32(1/448) = 1.0022 -> s = 2. 449 / 2 = 224.5
  // lies between 224 (0x76) and 240, nearer 224; 2^-7 / 2 = 2^-8 = 2 * 2^-9 is
  // the subnormal 0x02.
  x[128] = 449.0f, x[129] = 0x1p-7f;
  // Block 2: amax 1: t = f32(1/448) = 2.23e-3 in (2^-9, 2^-8] -> s = 2^-8.
  // 1 / s = 256 = 2^8 -> 0x78; -0.3 / s = -76.8 between 72 and 80, nearer 80
  // = 1.25 * 2^6 -> 1 1101 010 = 0xEA.
  x[256] = 1.0f, x[257] = -0.3f;
  const Quantized q = quant(x);
  EXPECT_EQ(q.scales[0], 1.0f);
  EXPECT_EQ(q.scales[1], 2.0f);
  EXPECT_EQ(q.scales[2], 0x1p-8f);
  const std::vector<std::pair<int, uint8_t>> want = {{0, 0x7E},   {1, 0x38},   {2, 0xC4},   {3, 0x2A},
                                                     {4, 0x00},   {128, 0x76}, {129, 0x02}, {256, 0x78},
                                                     {257, 0xEA}, {258, 0x00}};
  for (auto [i, b] : want) EXPECT_EQ(int(q.codes[size_t(i)]), int(b)) << "element " << i;
}

TEST(Fp8ActQuant, FloorZeroBlockAndPartialLastBlock) {
  // An all-zero block: amax floored to 1e-4, t = f32(1e-4 * f32(1/448)) =
  // 2.23e-7 in (2^-23, 2^-22] -> s = 2^-22, codes 0. A row of 160: blocks
  // [0, 128) and [128, 160), the last with its own amax 6 -> t = 6/448 =
  // 0.0134 in (2^-7, 2^-6] -> s = 2^-6: 6 / s = 384 = 1.5 * 2^8 -> 0x7C.
  std::vector<float> x(160, 0.0f);
  x[150] = -6.0f;
  const Quantized q = quant(x);
  ASSERT_EQ(q.scales.size(), 2u);
  EXPECT_EQ(q.scales[0], 0x1p-22f);
  EXPECT_EQ(q.scales[1], 0x1p-6f);
  EXPECT_EQ(int(q.codes[150]), 0xFC);
  for (int i = 0; i < 150; ++i) ASSERT_EQ(int(q.codes[size_t(i)]), 0) << i;
}

TEST(Fp8ActQuant, PowerOfTwoBoundaryRoundsUp) {
  // amax = 448 * 2^-5 = 14: t = 2^-5 exactly (the product rounds as for 448):
  // s = 2^-5 and 14 / s = 448 -> 0x7E. A hair above, 14.000001: t just above
  // 2^-5 -> s = 2^-4, 14.000001 / 2^-4 = 224.000016 -> 224 -> 0x76.
  std::vector<float> x(128, 0.0f);
  x[0] = 14.0f;
  Quantized q = quant(x);
  EXPECT_EQ(q.scales[0], 0x1p-5f);
  EXPECT_EQ(int(q.codes[0]), 0x7E);
  x[0] = std::nextafter(14.0f, 20.0f);
  q = quant(x);
  EXPECT_EQ(q.scales[0], 0x1p-4f);
  EXPECT_EQ(int(q.codes[0]), 0x76);
}

TEST(Fp8ActQuant, NanBlockOnlyAndQdqMatchesTheReference) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  std::vector<float> x = test::random_normal(rng, 3 * 128 + 64, 3.0f);
  x[200] = NAN;
  const Quantized q = quant(x);
  EXPECT_TRUE(std::isnan(q.scales[1]));
  std::vector<float> v(x.size());
  fp8_act_qdq(x.data(), int64_t(x.size()), v.data());
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = e4m3_decode(q.codes[i]) * q.scales[i / 128];
    if (i / 128 == 1) {
      ASSERT_TRUE(std::isnan(v[i])) << i;
      continue;
    }
    ASSERT_EQ(v[i], want) << "element " << i;
    ASSERT_TRUE(std::isfinite(v[i])) << i;
    // Scales are powers of two; |x| / s <= 448 by construction.
    const float s = q.scales[i / 128];
    ASSERT_EQ(std::exp2(std::round(std::log2(s))), s);
    ASSERT_LE(std::fabs(x[i]) / s, 448.0f);
  }
}

TEST(StageActivation, Bf16RoundsAndFp8RoundsToBf16First) {
  // 1 + 2^-9 rounds to 1 in BF16 (ties to even), 1 + 3 * 2^-9 to 1 + 2^-7.
  std::vector<float> x(128, 0.0f);
  x[0] = 1.0f + 0x1p-9f, x[1] = 1.0f + 3 * 0x1p-9f, x[2] = 448.0f;
  std::vector<float> v(128), g(1, 0.0f);
  stage_activation_rows(ActivationMode::Bf16, x.data(), 1, 128, nullptr, 0, v.data(), g.data());
  EXPECT_EQ(v[0], 1.0f);
  EXPECT_EQ(v[1], 1.0f + 0x1p-7f);
  EXPECT_EQ(g[0], 1.0f);
  // FP8 with s = 1: bf16(1 + 3 * 2^-9) = 1.0078125 -> E4M3 1 (spacing 1/8).
  stage_activation_rows(ActivationMode::Fp8, x.data(), 1, 128, nullptr, 0, v.data(), g.data());
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], 448.0f);
}

// The CUDA staging's multiply by 1/s (fp8_act_code_by_inverse) gives
// fp8_act_code's byte: every scale the formula can produce (amax from the
// floor 1e-4 to the largest float, NaN), values around every E4M3 rounding
// boundary and the clamp, signed zeros, subnormals, infinities.
TEST(Fp8ActQuant, MultiplyByTheInverseScaleIsTheDivision) {
  test::Rng rng(11);
  std::vector<float> scales;
  for (float a = fmt::kFp8ActAmaxFloor; std::isfinite(a); a *= 1.37f) scales.push_back(fmt::fp8_act_block_scale(a));
  scales.push_back(fmt::fp8_act_block_scale(3.4028235e38f));
  scales.push_back(fmt::fp8_act_block_scale(NAN));
  int64_t checked = 0;
  for (const float s : scales) {
    ASSERT_TRUE(std::isnan(s) || (s >= 0x1p-23f && s <= 0x1p120f)) << "scale " << s;
    const float inv = fmt::fp8_act_inverse_scale(s);
    auto check = [&](float q) {  // q = x / s as intended
      const float x = q * s;
      ASSERT_EQ(fmt::fp8_act_code_by_inverse(x, inv), fmt::fp8_act_code(x, s)) << "x " << x << " s " << s;
      ++checked;
    };
    for (int b = 0; b < 0x7F; ++b) {  // every E4M3 magnitude, its neighbours and the midpoints between them
      const float v = fmt::e4m3_value(uint8_t(b)), w = fmt::e4m3_value(uint8_t(b + 1));
      for (const float q : {v, 0.5f * (v + w), std::nextafter(0.5f * (v + w), 0.0f), std::nextafter(v, 1e9f)}) {
        check(q);
        check(-q);
      }
    }
    for (const float q : {0.0f, -0.0f, 448.0f, 449.0f, 1e6f, INFINITY, -INFINITY, 1e-40f, -1e-45f}) check(q);
    for (int i = 0; i < 2000; ++i) check(float(rng.normal()) * std::exp2(float(rng.below(30)) - 10.0f));
  }
  EXPECT_GT(checked, 100000);
  // A NaN quotient is the byte 0x7F whatever the sign bit of the NaN that
  // reaches it (x86 passes on an operand's NaN, the GPU its canonical one).
  for (const float x : {NAN, -NAN})
    for (const float s : {1.0f, 0x1p-23f, 0x1p120f, -NAN}) {
      EXPECT_EQ(fmt::fp8_act_code(x, s), 0x7F) << "x " << x << " s " << s;
      EXPECT_EQ(fmt::fp8_act_code_by_inverse(x, fmt::fp8_act_inverse_scale(s)), 0x7F) << "x " << x << " s " << s;
    }
}

}  // namespace
}  // namespace nvfp4moe::cpu
