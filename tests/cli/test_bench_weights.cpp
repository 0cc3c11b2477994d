// The benchmarks' weights (cli/bench_weights.hpp): random MXFP4 experts are
// valid DeepSeek-layout MXFP4 with the stated scale bytes, the same bytes
// whichever expert range asks for them, taken by the CUDA kernels' scale
// encoding; the bits a weight the rooflines count are those of the layouts;
// format names parse back and a wrong one is refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "cli/bench_weights.hpp"
#include "moe/random_weights.hpp"
#include "support/test_util.hpp"

#ifdef NVFP4MOE_HAS_CUDA
#include "cuda/layout/scale_multiplier.hpp"
#endif

namespace nvfp4moe {
namespace {

// H x I chosen so that an expert's w13 codes (1.5 MiB) span two generator streams.
MoeConfig bench_test_config() {
  MoeConfig c = small_demo_config();
  c.hidden = 2048;
  c.intermediate = 768;
  c.experts = 8;
  return c;
}

TEST(BenchWeights, RandomMxfp4ExpertsAreValidWithTheStatedBytes) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const MoeConfig cfg = bench_test_config();
  const ExpertWeights ex = make_random_mxfp4_experts(cfg, seed, 2, 4);
  EXPECT_EQ(ex.format, ExpertFormat::Mxfp4);
  EXPECT_EQ(ex.count, 4);
  EXPECT_EQ(ex.first_expert, 2);
  EXPECT_TRUE(ex.w13_global.empty() && ex.w2_global.empty() && ex.w13_input_scale.empty() &&
              ex.w2_input_scale.empty());
  EXPECT_NO_THROW(ex.validate());
  for (const auto* s : {&ex.w13_scales, &ex.w2_scales}) {
    const std::set<uint8_t> seen(s->begin(), s->end());
    EXPECT_EQ(int(seen.size()), kRandomMxfp4ScaleHi - kRandomMxfp4ScaleLo + 1);
    EXPECT_EQ(int(*seen.begin()), kRandomMxfp4ScaleLo);
    EXPECT_EQ(int(*seen.rbegin()), kRandomMxfp4ScaleHi);
  }
  for (const auto* c : {&ex.w13_codes, &ex.w2_codes}) {
    std::set<int> nibbles;
    for (uint8_t b : *c) nibbles.insert(b & 15), nibbles.insert(b >> 4);
    EXPECT_EQ(nibbles.size(), 16u) << "every E2M1 code, both nibbles";
  }
}

TEST(BenchWeights, AnExpertHasTheSameBytesWhicheverRangeAsks) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const MoeConfig cfg = bench_test_config();
  const ExpertWeights all = make_random_mxfp4_experts(cfg, seed, 0, 8);
  const ExpertWeights part = make_random_mxfp4_experts(cfg, seed, 3, 2);
  const ExpertWeights want = all.slice(3, 2);
  EXPECT_EQ(test::first_mismatch(part.w13_codes.data(), want.w13_codes.data(), int64_t(want.w13_codes.size())), -1);
  EXPECT_EQ(test::first_mismatch(part.w13_scales.data(), want.w13_scales.data(), int64_t(want.w13_scales.size())),
            -1);
  EXPECT_EQ(test::first_mismatch(part.w2_codes.data(), want.w2_codes.data(), int64_t(want.w2_codes.size())), -1);
  EXPECT_EQ(test::first_mismatch(part.w2_scales.data(), want.w2_scales.data(), int64_t(want.w2_scales.size())), -1);
  // Experts differ from each other, the two streams of one tensor too, and another seed gives other bytes.
  const int64_t per = int64_t(all.w13_codes.size()) / 8, chunk = int64_t(1) << 20;
  EXPECT_NE(test::first_mismatch(all.w13_codes.data(), all.w13_codes.data() + per, per), -1);
  EXPECT_NE(test::first_mismatch(all.w13_codes.data(), all.w13_codes.data() + chunk, per - chunk), -1);
  const ExpertWeights other = make_random_mxfp4_experts(cfg, seed + 1, 3, 2);
  EXPECT_NE(test::first_mismatch(other.w2_codes.data(), part.w2_codes.data(), int64_t(part.w2_codes.size())), -1);
  test::expect_error([&] { make_random_mxfp4_experts(cfg, seed, 6, 3); }, {"experts [6, 9)", "outside [0, 8)"});
}

TEST(BenchWeights, BitsAWeightAreThoseOfTheLayouts) {
  MoeConfig cfg = bench_test_config();
  cfg.shared_experts = 0;
  const double weights = double(cfg.experts) * 3.0 * double(cfg.hidden * cfg.intermediate);
  auto bits = [&](const ExpertWeights& ex) {
    return 8.0 * double(ex.w13_codes.size() + ex.w13_scales.size() + ex.w2_codes.size() + ex.w2_scales.size()) /
           weights;
  };
  EXPECT_EQ(bits(make_random_mxfp4_experts(cfg, 1, 0, cfg.experts)), checkpoint_bits_per_weight(ExpertFormat::Mxfp4));
  EXPECT_EQ(bits(make_random_nvfp4_moe(cfg, 1).experts), checkpoint_bits_per_weight(ExpertFormat::Nvfp4));
}

#ifdef NVFP4MOE_HAS_CUDA
// The CUDA upload encodes every random expert (no row group outside the
// window), each row group's factor from its smallest byte.
TEST(BenchWeights, TheCudaScaleEncodingTakesEveryRandomExpert) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const MoeConfig cfg = bench_test_config();
  const ExpertWeights ex = make_random_mxfp4_experts(cfg, seed, 0, 2);
  const int64_t H = cfg.hidden, I = cfg.intermediate;
  for (int64_t e = 0; e < ex.count; ++e)
    for (const cuda::Projection p : {cuda::Projection::GateUp, cuda::Projection::Down}) {
      const bool gu = p == cuda::Projection::GateUp;
      const std::vector<uint8_t>& codes = gu ? ex.w13_codes : ex.w2_codes;
      const std::vector<uint8_t>& scales = gu ? ex.w13_scales : ex.w2_scales;
      const int64_t n = gu ? 2 * I * H : H * I, groups = gu ? 2 : 1;  // weights, row groups
      const int64_t code_bytes = int64_t(codes.size()) / ex.count, scale_bytes = int64_t(scales.size()) / ex.count;
      ASSERT_EQ(code_bytes, n / 2);
      const cuda::LinearExpertProjection w{.format = ExpertFormat::Mxfp4, .projection = p, .hidden = H, .inter = I,
                                           .codes = codes.data() + e * code_bytes,
                                           .scales = scales.data() + e * scale_bytes, .expert = e};
      std::vector<uint8_t> c(static_cast<size_t>(code_bytes)), m(static_cast<size_t>(n / 16));
      float f[2] = {0, 0};
      ASSERT_NO_THROW(cuda::encode_weight_scales(w, c.data(), m.data(), f)) << "expert " << e << " w" << (gu ? 13 : 2);
      for (int64_t g = 0; g < groups; ++g) {
        const int64_t per = scale_bytes / groups;
        const uint8_t lo = *std::min_element(w.scales + g * per, w.scales + (g + 1) * per);
        EXPECT_EQ(f[g], cuda::mxfp4_row_group_factor(lo)) << "expert " << e << " w" << (gu ? 13 : 2) << " group " << g;
      }
    }
}
#endif

TEST(BenchWeights, FormatNamesParseBackAndAWrongOneIsNamed) {
  for (const ExpertFormat f : {ExpertFormat::Nvfp4, ExpertFormat::Mxfp4})
    EXPECT_EQ(parse_format_option(format_option_name(f)), f) << format_option_name(f);
  EXPECT_STREQ(format_option_name(ExpertFormat::Mxfp4), "mxfp4");
  test::expect_error([] { parse_format_option("MXFP4"); }, {"'MXFP4'", "expected nvfp4 or mxfp4"});
  test::expect_error([] { parse_format_option(""); }, {"''", "expected nvfp4 or mxfp4"});
}

TEST(BenchWeights, SharedFormatNamesParseAndAWrongOneIsNamed) {
  EXPECT_EQ(parse_shared_format_option("bf16"), SharedExpertFormat::Bf16);
  EXPECT_EQ(parse_shared_format_option("fp8"), SharedExpertFormat::Fp8Block);
  test::expect_error([] { parse_shared_format_option("FP8"); }, {"'FP8'", "expected bf16 or fp8"});
}

}  // namespace
}  // namespace nvfp4moe
