// The CPU backend with MXFP4 routed experts and the activation modes of
// docs/numerics.md §7 (nvfp4, bf16, fp8), against the FP64 evaluation on
// fresh random inputs; NVFP4 experts under the bf16 and fp8 modes; the
// checks ExpertWeights / MoeConfig make of the new fields; the CUDA backend's
// refusal naming the format.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/ep.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

std::vector<float> routed_y(MoeLayer& layer, const std::vector<float>& x, int64_t T, HostResult* result = nullptr) {
  HostResult r = layer.forward_host(HostBatch{x, T});
  if (result) *result = r;
  return r.y;
}

void expect_close_to_f64(const MoeWeights& w, const std::vector<float>& x, int64_t T, const HostResult& r) {
  EXPECT_EQ(count_non_finite(r.y), 0);
  const std::vector<double> ref = reference_moe_f64(w, x, T, r.topk_ids, r.topk_weights);
  EXPECT_LT(rel_l2(r.y, ref), 1e-2);
}

TEST(CpuMxfp4Moe, EveryActivationModeMatchesF64) {
  const uint64_t seed = fresh_seed();
  for (ActivationMode mode : {ActivationMode::Fp8, ActivationMode::Bf16, ActivationMode::Nvfp4})
    for (int64_t T : {1, 5, 80}) {
      MoeConfig c = small_config(256, 384, 8, 2);  // I spans 3 FP8 blocks of 128
      c.activation = mode;
      SCOPED_TRACE(::testing::Message() << "seed=" << seed << " " << describe(c, T) << " act "
                                        << activation_mode_name(mode));
      Rng rng(seed + uint64_t(T) * 3 + uint64_t(mode));
      MoeWeights w = make_synthetic_moe(c, rng.next());
      w.experts = random_mxfp4_experts(rng, c.experts, c.hidden, c.intermediate);
      const std::vector<float> x = random_hidden(rng, T, c.hidden);
      Moe moe(w, MoeOptions{});
      HostResult r;
      routed_y(moe, x, T, &r);
      expect_close_to_f64(w, x, T, r);
      // The thread count and the expert-parallel split change nothing.
      Moe one(w, MoeOptions{.threads = 1});
      EXPECT_EQ(routed_y(one, x, T), r.y);
      CpuEpMoe ep(w, 2);
      EXPECT_EQ(routed_y(ep, x, T), r.y);
    }
}

TEST(CpuMxfp4Moe, Nvfp4ExpertsUnderBf16AndFp8Modes) {
  const uint64_t seed = fresh_seed();
  for (ActivationMode mode : {ActivationMode::Fp8, ActivationMode::Bf16}) {
    MoeConfig c = small_config(128, 160, 16, 4);  // I = 128 + a partial FP8 block of 32
    c.activation = mode;
    const int64_t T = 33;
    SCOPED_TRACE(::testing::Message() << "seed=" << seed << " " << describe(c, T) << " act "
                                      << activation_mode_name(mode));
    Rng rng(seed + uint64_t(mode));
    const MoeWeights w = make_synthetic_moe(c, rng.next());
    const std::vector<float> x = random_hidden(rng, T, c.hidden);
    Moe moe(w, MoeOptions{});
    HostResult r;
    routed_y(moe, x, T, &r);
    expect_close_to_f64(w, x, T, r);
    // The modes differ from the nvfp4 default: the staging is not a no-op.
    MoeWeights d = w;
    d.config.activation = ActivationMode::Nvfp4;
    Moe def(d, MoeOptions{});
    EXPECT_NE(routed_y(def, x, T), r.y);
  }
}

TEST(CpuMxfp4Moe, NanTokenStaysItsOwn) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  MoeConfig c = small_config(128, 128, 8, 2);
  c.activation = ActivationMode::Fp8;
  MoeWeights w = make_synthetic_moe(c, rng.next());
  w.experts = random_mxfp4_experts(rng, c.experts, c.hidden, c.intermediate);
  const int64_t T = 4;
  std::vector<float> x = random_hidden(rng, T, c.hidden);
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> wts(8, 0.5f);
  Moe moe(w, MoeOptions{});
  HostBatch b{x, T};
  b.topk_ids = std::span<const int32_t>(ids);
  b.topk_weights = std::span<const float>(wts);
  const std::vector<float> clean = moe.forward_host(b).y;
  x[size_t(2 * c.hidden + 5)] = NAN;
  const std::vector<float> y = moe.forward_host(b).y;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < c.hidden; ++i) {
      const float v = y[size_t(t * c.hidden + i)];
      if (t == 2) ASSERT_TRUE(std::isnan(v)) << "token 2 element " << i;
      else ASSERT_EQ(v, clean[size_t(t * c.hidden + i)]) << "token " << t << " element " << i;
    }
}

TEST(CpuMxfp4Moe, ValidationNamesFormatAndField) {
  Rng rng(7);
  MoeConfig c = small_config(64, 64, 4, 2);
  MoeWeights w = make_synthetic_moe(c, 1);
  w.experts = random_mxfp4_experts(rng, 4, 64, 64);
  EXPECT_NO_THROW(w.experts.validate());
  ExpertWeights bad = w.experts;
  bad.w2_global.assign(4, 1.0f);
  EXPECT_ERROR_CONTAINS(bad.validate(), "ExpertWeights (MXFP4)", "w2_global has 4 elements, expected 0");
  bad = w.experts;
  bad.w13_scales.pop_back();
  EXPECT_ERROR_CONTAINS(bad.validate(), "w13_scales has 1023 elements, expected 1024");
  bad = w.experts;
  bad.w2_scales[3 * 64 * 64 / 32 + 5] = 0xFF;
  EXPECT_ERROR_CONTAINS(bad.validate(), "expert 3 w2_scales", "row 2, block 1", "NaN byte 0xff");
  bad = w.experts;
  bad.w13_input_scale.assign(4, 1e-3f);
  EXPECT_ERROR_CONTAINS(bad.validate(), "MXFP4 experts carry none");
  bad = w.experts;
  bad.hidden = bad.intermediate = 48;  // a multiple of 16, not of 32
  EXPECT_ERROR_CONTAINS(bad.validate(), "multiples of the scale block 32");
  // A slice keeps the format and its 32-element scale rows.
  const ExpertWeights s = w.experts.slice(1, 2);
  EXPECT_EQ(s.format, ExpertFormat::Mxfp4);
  EXPECT_NO_THROW(s.validate());
  EXPECT_TRUE(std::equal(s.w2_scales.begin(), s.w2_scales.end(), w.experts.w2_scales.begin() + 64 * 64 / 32));
  // Static input scales are NVFP4 global scales.
  MoeConfig sc = c;
  sc.activation = ActivationMode::Fp8;
  sc.l1_input = InputScaleMode::Static;
  EXPECT_ERROR_CONTAINS(sc.validate(), "activation mode fp8 takes none", "l1_input static");
  EXPECT_EQ(parse_activation_mode("bf16"), ActivationMode::Bf16);
  // The writer writes NVFP4 experts only, and says so.
  EXPECT_ERROR_CONTAINS(save_moe_layer("/nonexistent", 0, w), "routed experts are MXFP4", "writes NVFP4 experts");
  EXPECT_ERROR_CONTAINS(parse_activation_mode("int8"), "unknown activation mode 'int8'", "nvfp4, bf16 or fp8");
}

// The CUDA backend takes MXFP4 experts and every activation mode: without a
// device the only refusal is the missing device, never the format or mode.
TEST(CpuMxfp4Moe, CudaBackendTakesMxfp4AndEveryMode) {
  Rng rng(3);
  MoeConfig c = small_config(128, 128, 4, 2);
  for (const ExpertFormat f : {ExpertFormat::Nvfp4, ExpertFormat::Mxfp4})
    for (const ActivationMode m : {ActivationMode::Nvfp4, ActivationMode::Bf16, ActivationMode::Fp8}) {
      SCOPED_TRACE(::testing::Message() << expert_format_name(f) << " x " << activation_mode_name(m));
      MoeWeights w = make_synthetic_moe(c, 1);
      if (f == ExpertFormat::Mxfp4) w.experts = random_mxfp4_experts(rng, 4, 128, 128);
      w.config.activation = m;
      if (cuda_available()) {
        EXPECT_NO_THROW(Moe(w, MoeOptions{.backend = Backend::Cuda}));
      } else {
        EXPECT_ERROR_CONTAINS(Moe(w, MoeOptions{.backend = Backend::Cuda}), "device cuda requested but no CUDA device");
      }
    }
}

}  // namespace
}  // namespace nvfp4moe::test
