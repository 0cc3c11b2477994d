// make_synthetic_moe / synthetic_expert_dense: deterministic, regenerable one
// expert at a time, quantized exactly, scaled like real weights.
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

TEST(Synthetic, OneExpertRegeneratesAloneAndQuantizesToTheStoredBytes) {
  MoeConfig c = small_config(128, 64, 6, 2);
  c.hash_routed = true;
  SyntheticDense dense;
  const MoeWeights w = make_synthetic_moe(c, 42, &dense);
  const int64_t H = c.hidden, I = c.intermediate;
  for (int64_t e : {0, 3, 5}) {
    const SyntheticExpertDense d = synthetic_expert_dense(c, 42, e);
    ASSERT_TRUE(std::equal(d.w1.begin(), d.w1.end(), dense.w1.begin() + e * I * H)) << "expert " << e;
    ASSERT_TRUE(std::equal(d.w2.begin(), d.w2.end(), dense.w2.begin() + e * H * I)) << "expert " << e;
    const Nvfp4Matrix up = quantize_matrix(d.w3.data(), I, H, ScaleScope::PerTensor);
    EXPECT_BYTES_EQ(up.codes.data(), w.experts.w13_codes.data() + (e * 2 * I + I) * H / 2, I * H / 2, "up codes");
    EXPECT_BYTES_EQ(up.scales.data(), w.experts.w13_scales.data() + (e * 2 * I + I) * H / 16, I * H / 16,
                    "up scales");
    EXPECT_EQ(up.global_scale[0], w.experts.w13_global[size_t(2 * e + 1)]);
  }
  // Deterministic: the same seed gives the same bytes; another seed does not.
  EXPECT_EQ(make_synthetic_moe(c, 42).experts.w2_codes, w.experts.w2_codes);
  EXPECT_NE(make_synthetic_moe(c, 43).experts.w2_codes, w.experts.w2_codes);
  // tid2eid: k distinct experts in [0, E) per token id.
  ASSERT_EQ(int64_t(w.router.tid2eid.size()), kSyntheticVocab * c.top_k);
  for (int64_t v = 0; v < kSyntheticVocab; ++v) {
    std::set<int32_t> ids(w.router.tid2eid.begin() + v * c.top_k, w.router.tid2eid.begin() + (v + 1) * c.top_k);
    ASSERT_EQ(int64_t(ids.size()), c.top_k) << "token id " << v;
    ASSERT_TRUE(*ids.begin() >= 0 && *ids.rbegin() < c.experts) << "token id " << v;
  }
  w.experts.validate();
}

TEST(Synthetic, ScaledLikeRealWeights) {
  MoeConfig c = small_config(1024, 256, 2, 1);
  const SyntheticExpertDense d = synthetic_expert_dense(c, 7, 1);
  double sum2 = 0, amax = 0;
  for (float v : d.w1) {
    sum2 += double(v) * v;
    amax = std::max(amax, double(std::fabs(v)));
  }
  const double stddev = std::sqrt(sum2 / double(d.w1.size())), want = 1.0 / std::sqrt(1024.0);
  EXPECT_NEAR(stddev, want, 0.1 * want) << "~N(0, 1/fan_in)";
  EXPECT_GT(amax, 8.0 * want) << "a few outliers";
  const std::vector<float> x = synthetic_hidden_states(c, 7, 3);
  EXPECT_EQ(int64_t(x.size()), 3 * c.hidden);
}

}  // namespace
}  // namespace nvfp4moe::test
