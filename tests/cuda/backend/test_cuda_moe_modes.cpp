// The cuda backend with MXFP4 routed experts and the bf16 / fp8 activation
// modes (docs/numerics.md §7) against the CPU backend: every format x mode,
// decode and prefill token counts (T = 1, 8: the 32-wide prefill launch, as
// this geometry's down K of 512 rules out the decode kernel; 64, 300, 2048:
// the Split launches), the fragment and the tile layout. bf16 has no
// quantization discontinuity, so it is held to a tighter bound than §8's.
// MXFP4 experts the kernels cannot hold exactly are refused naming them.
// Weights whose rows are E4M3 values times a power of two (MXFP4 over a
// narrow window of scales, NVFP4 with power-of-two block scales) take the
// prefill GEMM's FP8 form in the fp8 mode, which is checked the same way and
// against the BF16 form on the same weights.
#include "cuda_moe_harness.hpp"
#include "support/moe_test_util.hpp"

namespace nvfp4moe {
namespace {

using namespace nvfp4moe::test;

constexpr double kTightTol = 5e-3;  // bf16 mode: the same operands, only the sum order and the shared expert differ

// MXFP4 experts over a window of 27 binades of scales (bytes 100..126), every
// code; a few all-zero blocks with an arbitrary byte.
ExpertWeights wide_mxfp4_experts(Rng& rng, int64_t E, int64_t H, int64_t I) {
  ExpertWeights ex = random_mxfp4_experts(rng, E, H, I);
  for (auto* s : {&ex.w13_scales, &ex.w2_scales})
    for (auto& b : *s) b = uint8_t(rng.below(8) == 0 ? 100 + rng.below(27) : 116 + rng.below(4));
  for (int64_t i = 0; i < 16; ++i) {
    const int64_t blk = rng.below(int64_t(ex.w2_scales.size()));
    ex.w2_scales[size_t(blk)] = uint8_t(rng.below(253));
    std::fill_n(ex.w2_codes.begin() + blk * 16, 16, uint8_t(0x08));
  }
  return ex;
}

// Rows E4M3 values times a power of two (docs/numerics.md §8): MXFP4 bytes
// within 11 binades, or NVFP4 block scales 2^-4 .. 2^7 (UE4M3 bytes e << 3).
void make_fp8_exact(ExpertWeights& ex, Rng& rng) {
  for (auto* s : {&ex.w13_scales, &ex.w2_scales})
    for (auto& b : *s)
      b = ex.format == ExpertFormat::Mxfp4 ? uint8_t(116 + rng.below(11)) : uint8_t((3 + rng.below(12)) << 3);
}

MoeWeights weights_for(const MoeConfig& cfg, ExpertFormat f, ActivationMode m, Rng& rng, bool fp8_exact = false) {
  MoeWeights w = make_random_nvfp4_moe(cfg, rng.next());
  if (f == ExpertFormat::Mxfp4) w.experts = wide_mxfp4_experts(rng, cfg.experts, cfg.hidden, cfg.intermediate);
  if (fp8_exact) make_fp8_exact(w.experts, rng);
  w.config.activation = m;
  return w;
}

struct Case {
  ExpertFormat format;
  ActivationMode mode;
  bool fp8_exact = false;  // weights the FP8 form of the prefill GEMM takes
};

class CudaMoeModes : public ::testing::TestWithParam<Case> {};

TEST_P(CudaMoeModes, MatchesTheCpuBackendDecodeAndPrefill) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << expert_format_name(c.format) << " x "
                                    << activation_mode_name(c.mode));
  Rng rng(seed);
  const double tol = c.mode == ActivationMode::Bf16 ? kTightTol : kTol;
  const MoeConfig cfg = small_demo_config();  // H = 1024, I = 512: the fragment layout
  const MoeWeights w = weights_for(cfg, c.format, c.mode, rng, c.fp8_exact);
  Moe gpu = gpu_moe(w, 2048);
  Moe cpu = cpu_twin(w);
  const bool fp8 = c.fp8_exact && c.mode == ActivationMode::Fp8;
  EXPECT_EQ(gpu.prefill_mma().substr(0, fp8 ? 3 : 4), fp8 ? "fp8" : "bf16") << gpu.prefill_mma();
  for (int64_t T : {1, 8, 64, 300, 2048}) check_against_cpu(gpu, cpu, w, T, rng.next(), nullptr, nullptr, false, false, tol);
  // BF16 x: in both modes the operand is then x itself before the FP8 step.
  check_against_cpu(gpu, cpu, w, 77, rng.next(), nullptr, nullptr, /*x_bf16=*/true, false, tol);
  if (!fp8) return;
  // The BF16 form on the same weights: both within the CPU's tolerance, and
  // of each other (they differ by the tensor cores' FP8 sums over 128 columns
  // and by what that moves across h's quantization boundaries, the level the
  // CPU comparison shows).
  Moe bf16 = gpu_moe(w, 2048, false, /*fp8_mma=*/false);
  EXPECT_EQ(bf16.prefill_mma(), "bf16");
  check_against_cpu(bf16, cpu, w, 300, rng.next(), nullptr, nullptr, false, false, tol);
  for (int64_t T : {300, 2048}) {
    const std::vector<float> x = random_normal(rng, T * cfg.hidden);
    const GpuOutput a = gpu_forward(gpu, x, T, nullptr, nullptr), b = gpu_forward(bf16, x, T, nullptr, nullptr);
    double num = 0, den = 0;
    for (size_t i = 0; i < a.y.size(); ++i) {
      num += double(a.y[i] - b.y[i]) * double(a.y[i] - b.y[i]);
      den += double(b.y[i]) * double(b.y[i]);
    }
    EXPECT_LT(std::sqrt(num / den), tol) << "FP8 against BF16 form, T=" << T;
    std::printf("    [T=%lld] rel L2 FP8 against BF16 form = %.3g\n", (long long)T, std::sqrt(num / den));
  }
}

TEST_P(CudaMoeModes, TileLayoutShapesMatchTheCpuBackend) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " " << expert_format_name(c.format) << " x "
                                    << activation_mode_name(c.mode));
  Rng rng(seed);
  MoeConfig cfg = small_config(224, 160, 10, 3);  // K not a multiple of 128: the tile layout and grouped_gemm_ref
  const MoeWeights w = weights_for(cfg, c.format, c.mode, rng, c.fp8_exact);
  Moe gpu = gpu_moe(w, 300);
  Moe cpu = cpu_twin(w);
  for (int64_t T : {1, 64, 300})
    check_against_cpu(gpu, cpu, w, T, rng.next(), nullptr, nullptr, false, false,
                      c.mode == ActivationMode::Bf16 ? kTightTol : kTol);
}

// A NaN in one token's x reaches that token only, in every mode.
TEST_P(CudaMoeModes, NanTokenOnlyAffectsItself) {
  SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  Rng rng(fresh_seed());
  const MoeConfig cfg = small_demo_config();
  const MoeWeights w = weights_for(cfg, c.format, c.mode, rng, c.fp8_exact);
  const int64_t T = c.fp8_exact ? 600 : 40, H = cfg.hidden;  // 600: the prefill GEMM
  Moe gpu = gpu_moe(w, T);
  std::vector<float> x = random_normal(rng, T * H);
  std::vector<int32_t> ids;  // caller routing: the NaN token's routing stays what it was
  std::vector<float> wt;
  ep_routing(rng, T, cfg.top_k, cfg.experts, 0, cfg.experts, ids, wt);
  const GpuOutput clean = gpu_forward(gpu, x, T, &ids, &wt);
  x[size_t(7 * H + 100)] = std::nanf("");
  const GpuOutput dirty = gpu_forward(gpu, x, T, &ids, &wt);
  for (int64_t t = 0; t < T; ++t) {
    bool same = true, nan = false;
    for (int64_t i = 0; i < H; ++i) {
      const float a = clean.y[size_t(t * H + i)], b = dirty.y[size_t(t * H + i)];
      same &= std::memcmp(&a, &b, 4) == 0;
      nan |= std::isnan(b);
    }
    if (t == 7)
      EXPECT_TRUE(nan) << "the NaN token's output";
    else
      EXPECT_TRUE(same) << "token " << t << " changed";
  }
}

INSTANTIATE_TEST_SUITE_P(FormatsAndModes, CudaMoeModes,
                         ::testing::Values(Case{ExpertFormat::Mxfp4, ActivationMode::Nvfp4},
                                           Case{ExpertFormat::Mxfp4, ActivationMode::Bf16},
                                           Case{ExpertFormat::Mxfp4, ActivationMode::Fp8},
                                           Case{ExpertFormat::Nvfp4, ActivationMode::Bf16},
                                           Case{ExpertFormat::Nvfp4, ActivationMode::Fp8},
                                           Case{ExpertFormat::Mxfp4, ActivationMode::Fp8, true},
                                           Case{ExpertFormat::Nvfp4, ActivationMode::Fp8, true},
                                           Case{ExpertFormat::Mxfp4, ActivationMode::Bf16, true}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(expert_format_name(i.param.format)) + "_" +
                                  activation_mode_name(i.param.mode) + (i.param.fp8_exact ? "_fp8_exact" : "");
                         });

TEST(CudaMoeModes, Mxfp4ExpertOutsideTheWindowIsRefusedNamingIt) {
  SKIP_WITHOUT_GPU();
  Rng rng(5);
  const MoeConfig cfg = small_demo_config();
  MoeWeights w = weights_for(cfg, ExpertFormat::Mxfp4, ActivationMode::Fp8, rng);
  const int64_t per_expert = cfg.hidden * cfg.intermediate / 32;  // w2 scale bytes of one expert
  w.experts.w2_scales[size_t(3 * per_expert + 17)] = 160;        // expert 3: 60 binades above its smallest
  w.experts.w2_codes[size_t((3 * per_expert + 17) * 16)] = 0x11;
  EXPECT_ERROR_CONTAINS(gpu_moe(w, 8), "MXFP4 expert 3 w2 (down)", "UE8M0 byte 0xa0", "at most 31 binades");
}

}  // namespace
}  // namespace nvfp4moe
