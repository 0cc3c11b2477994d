// make_synthetic_moe_cuda against make_synthetic_moe: the same layer, byte for
// byte (the generator's bits agree on host and device and the GPU quantizer
// is the host's formula), on geometries with hash routing and without.
#include <gtest/gtest.h>

#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(DeviceSynthetic, SameLayerAsTheHost) {
  SKIP_WITHOUT_GPU();
  MoeConfig hashed = small_demo_config();
  hashed.hash_routed = true;
  MoeConfig odd = small_demo_config();
  odd.hidden = 272;
  odd.intermediate = 208;
  for (const MoeConfig& cfg : {small_demo_config(), hashed, odd}) {
    const uint64_t seed = test::fresh_seed();
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " H=" << cfg.hidden << " I=" << cfg.intermediate);
    const MoeWeights host = make_synthetic_moe(cfg, seed);
    const MoeWeights dev = make_synthetic_moe_cuda(cfg, seed);
    EXPECT_EQ(dev.experts.w13_codes, host.experts.w13_codes);
    EXPECT_EQ(dev.experts.w13_scales, host.experts.w13_scales);
    EXPECT_EQ(dev.experts.w13_global, host.experts.w13_global);
    EXPECT_EQ(dev.experts.w2_codes, host.experts.w2_codes);
    EXPECT_EQ(dev.experts.w2_scales, host.experts.w2_scales);
    EXPECT_EQ(dev.experts.w2_global, host.experts.w2_global);
    EXPECT_EQ(dev.experts.w13_input_scale, host.experts.w13_input_scale);
    EXPECT_EQ(dev.router.gate, host.router.gate);
    EXPECT_EQ(dev.router.tid2eid, host.router.tid2eid);
  }
}

}  // namespace
}  // namespace nvfp4moe
