// make_random_fp8_shared_expert: the bench's FP8 shared expert, as both
// DeepSeek-V4 releases hold theirs.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "cpu/cpu_moe.hpp"
#include "moe/random_weights.hpp"
#include "nvfp4moe/format.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

// Every factor is 2^(e - 1), 2^e or 2^(e + 1) for e = fp8_shared_factor_exponent(K), and all three occur.
void expect_factors(const std::vector<float>& f, int64_t k, const char* what) {
  const int e = fp8_shared_factor_exponent(k);
  std::set<int> seen;
  for (float v : f) {
    int x = 0;
    ASSERT_EQ(std::frexp(v, &x), 0.5f) << what << ": " << v << " is not a power of two";
    ASSERT_GE(x - 1, e - 1) << what << ": " << v;
    ASSERT_LE(x - 1, e + 1) << what << ": " << v;
    seen.insert(x - 1);
  }
  EXPECT_EQ(seen.size(), 3u) << what;
}

TEST(RandomFp8SharedExpert, HoldsE4m3BytesWithPowerOfTwoTileFactors) {
  const int64_t H = 512, Is = 384;  // 4 x 3 tiles
  const SharedExpertWeights s = make_random_fp8_shared_expert(H, Is, 7);
  ASSERT_EQ(s.format, SharedExpertFormat::Fp8Block);
  ASSERT_EQ(s.w1_fp8.size(), size_t(Is * H));
  ASSERT_EQ(s.w2_fp8.size(), size_t(H * Is));
  ASSERT_EQ(s.w1_scale.size(), 3u * 4u);
  ASSERT_EQ(s.w2_scale.size(), 4u * 3u);
  for (const auto* b : {&s.w1_fp8, &s.w3_fp8, &s.w2_fp8}) {
    std::set<uint8_t> bytes(b->begin(), b->end());
    EXPECT_EQ(bytes.count(0x7F) + bytes.count(0xFF), 0u) << "a NaN byte";
    EXPECT_EQ(bytes.size(), 254u) << "every other byte occurs";
  }
  EXPECT_EQ(fp8_shared_factor_exponent(7168), -13);  // round(log2(100.06 * 84.66)) = round(13.05)
  EXPECT_EQ(fp8_shared_factor_exponent(3072), -12);  // round(12.44)
  expect_factors(s.w1_scale, H, "w1");
  expect_factors(s.w3_scale, H, "w3");
  expect_factors(s.w2_scale, Is, "w2");
  EXPECT_NE(s.w1_fp8, s.w3_fp8);
}

TEST(RandomFp8SharedExpert, SameSeedSameBytesOtherSeedOthers) {
  const SharedExpertWeights a = make_random_fp8_shared_expert(256, 128, 3);
  const SharedExpertWeights b = make_random_fp8_shared_expert(256, 128, 3);
  const SharedExpertWeights c = make_random_fp8_shared_expert(256, 128, 4);
  EXPECT_EQ(a.w1_fp8, b.w1_fp8);
  EXPECT_EQ(a.w2_scale, b.w2_scale);
  EXPECT_NE(a.w1_fp8, c.w1_fp8);
  EXPECT_NE(a.w2_fp8, c.w2_fp8);
}

TEST(RandomFp8SharedExpert, IsTheLayersSharedExpertWhenAskedFor) {
  const MoeConfig c = small_config(256, 128, 8, 2);
  const MoeWeights bf16 = make_random_nvfp4_moe(c, 9);
  EXPECT_EQ(bf16.shared.format, SharedExpertFormat::Bf16);
  EXPECT_EQ(bf16.shared.w1.size(), size_t(c.shared_inter() * c.hidden));
  const MoeWeights fp8 = make_random_nvfp4_moe(c, 9, 0, 0, kRandomMoeVocab, SharedExpertFormat::Fp8Block);
  EXPECT_EQ(fp8.shared.format, SharedExpertFormat::Fp8Block);
  EXPECT_TRUE(fp8.shared.w1.empty() && fp8.shared.w2.empty());  // no BF16 weights made and dropped
  EXPECT_EQ(fp8.shared.w2_fp8, make_random_fp8_shared_expert(c.hidden, c.shared_inter(), 9).w2_fp8);
  EXPECT_EQ(fp8.experts.w13_codes, bf16.experts.w13_codes);  // the routed experts alike
}

// The factors make the projections O(1): the shared expert of N(0, 1) inputs
// has an output RMS near 1 (16 sqrt(K) in place of 100 sqrt(K) would give ~400).
TEST(RandomFp8SharedExpert, GivesOutputsOfOrderOneForUnitInputs) {
  MoeConfig c = small_config(1024, 256, 8, 2);
  c.shared_experts = 1;
  const int64_t H = c.hidden, T = 8;
  const SharedExpertWeights s = make_random_fp8_shared_expert(H, c.shared_inter(), 11);
  Rng rng(5);
  std::vector<float> x(size_t(T * H)), y(size_t(T * H));
  for (float& v : x) v = rng.normal();
  cpu::run_shared_expert(c, s, x.data(), T, y.data(), 1);
  double ss = 0;
  for (float v : y) {
    ASSERT_TRUE(std::isfinite(v));
    ss += double(v) * v;
  }
  const double rms = std::sqrt(ss / double(y.size()));
  EXPECT_GT(rms, 0.1);
  EXPECT_LT(rms, 10.0);
}

}  // namespace
}  // namespace nvfp4moe::test
