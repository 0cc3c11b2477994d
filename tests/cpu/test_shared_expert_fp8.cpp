// The block-scaled FP8 shared expert on the CPU backend: against the FP64
// reference (weights dequantized in double), bit for bit against BF16 weights
// holding the same values (power-of-two tile factors, as F8_E8M0 scales
// give), inside a whole MoE forward, and every malformed weight set refused
// naming the field and the values.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/cpu_moe.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/moe_test_util.hpp"
#include "support/shared_fp8_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

// H = 272 spans three 128-column tiles (the last one partial), Is = 144 two rows of tiles.
constexpr int64_t kH = 272, kIs = 144;

MoeConfig shared_config() {
  MoeConfig c = test::small_config(kH, 64, 8, 2);
  c.shared_intermediate = kIs;
  return c;
}

std::vector<float> run_shared(const MoeConfig& c, const SharedExpertWeights& s, const std::vector<float>& x,
                              int64_t T, int threads = 2) {
  std::vector<float> out(static_cast<size_t>(T * c.hidden), NAN);
  cpu::run_shared_expert(c, s, x.data(), T, out.data(), threads);
  return out;
}

TEST(SharedExpertFp8, MatchesTheFp64ReferenceWithArbitraryTileFactors) {
  const uint64_t seed = test::fresh_seed();
  test::Rng rng(seed);
  MoeWeights w;
  w.config = shared_config();
  w.shared = test::random_fp8_shared(rng, kH, kIs, test::TileScales::Arbitrary);
  for (int64_t T : {1, 4, 9}) {
    SCOPED_TRACE("seed " + std::to_string(seed) + " T=" + std::to_string(T));
    const std::vector<float> x = test::random_hidden(rng, T, kH);
    const std::vector<float> got = run_shared(w.config, w.shared, x, T);
    const std::vector<double> want = test::reference_shared_f64(w, x, T);
    EXPECT_EQ(test::count_non_finite(got), 0);
    EXPECT_LT(test::rel_l2(got, want), 2e-6);  // FP32 sums of exact products
    double norm = 0;
    for (double v : want) norm += v * v;
    EXPECT_GT(norm, 1.0);  // the outputs are not all clamped to nothing
  }
}

TEST(SharedExpertFp8, EqualsBf16WeightsOfTheSameValuesBitForBit) {
  const uint64_t seed = test::fresh_seed();
  test::Rng rng(seed);
  const MoeConfig c = shared_config();
  const SharedExpertWeights fp8 = test::random_fp8_shared(rng, kH, kIs, test::TileScales::PowersOfTwo);
  const SharedExpertWeights bf16 = test::bf16_twin(fp8, kH, kIs);
  // The twin holds the same values (the factors are powers of two).
  MoeWeights a, b;
  a.config = b.config = c;
  a.shared = fp8;
  b.shared = bf16;
  EXPECT_EQ(test::shared_weights_f64(fp8, 3, kIs, kH), test::shared_weights_f64(bf16, 3, kIs, kH));
  for (int64_t T : {1, 3, 5, 16}) {  // BF16 widens inside the dots up to 4 tokens, per tile beyond
    SCOPED_TRACE("seed " + std::to_string(seed) + " T=" + std::to_string(T));
    const std::vector<float> x = test::random_hidden(rng, T, kH);
    const std::vector<float> y8 = run_shared(c, fp8, x, T, 1), y16 = run_shared(c, bf16, x, T, 2);
    ASSERT_EQ(y8.size(), y16.size());
    for (size_t i = 0; i < y8.size(); ++i) ASSERT_EQ(y8[i], y16[i]) << "element " << i;
  }
}

TEST(SharedExpertFp8, WholeMoeForwardWithAnFp8SharedExpert) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  MoeWeights w8 = make_synthetic_moe(shared_config(), rng.next());
  w8.shared = test::random_fp8_shared(rng, kH, kIs, test::TileScales::PowersOfTwo);
  MoeWeights w16 = w8;
  w16.shared = test::bf16_twin(w8.shared, kH, kIs);
  const int64_t T = 7;
  const std::vector<float> x = test::random_hidden(rng, T, kH);
  Moe m8(w8, MoeOptions{}), m16(w16, MoeOptions{});
  const HostResult r8 = m8.forward_host(HostBatch{x, T}), r16 = m16.forward_host(HostBatch{x, T});
  EXPECT_EQ(r8.topk_ids, r16.topk_ids);
  EXPECT_EQ(r8.y, r16.y);
  // And the whole layer is within the contract's tolerance of the FP64 evaluation.
  const std::vector<double> ref = test::reference_moe_f64(w8, x, T, r8.topk_ids, r8.topk_weights);
  EXPECT_LT(test::rel_l2(r8.y, ref), 1e-2);
}

TEST(SharedExpertFp8, MalformedWeightsNameTheFieldAndValues) {
  test::Rng rng(5);
  const MoeConfig c = shared_config();
  const SharedExpertWeights good = test::random_fp8_shared(rng, kH, kIs, test::TileScales::Arbitrary);
  EXPECT_NO_THROW(good.validate(kH, kIs));
  struct Case {
    const char* label;
    void (*edit)(SharedExpertWeights&);
    std::vector<std::string> message;
  };
  const Case cases[] = {
      {"scale count", [](SharedExpertWeights& s) { s.w1_scale.pop_back(); },
       {"w1_scale=5 elements, expected 6", "Is=144 H=272", "FP8"}},
      {"NaN scale", [](SharedExpertWeights& s) { s.w3_scale[4] = NAN; }, {"w3_scale of tile (1, 1) is nan"}},
      {"negative scale", [](SharedExpertWeights& s) { s.w2_scale[1] = -1.0f; }, {"w2_scale of tile (0, 1) is -1"}},
      {"zero scale", [](SharedExpertWeights& s) { s.w2_scale[0] = 0.0f; }, {"w2_scale of tile (0, 0) is 0"}},
      {"weight size", [](SharedExpertWeights& s) { s.w2_fp8.resize(10); }, {"w2_fp8=10 elements, expected 39168"}},
      {"BF16 format without BF16 weights", [](SharedExpertWeights& s) { s.format = SharedExpertFormat::Bf16; },
       {"w1=0 elements, expected 39168", "format BF16"}},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(k.label);
    SharedExpertWeights s = good;
    k.edit(s);
    const std::vector<std::string>& msg = k.message;
    for (const std::string& piece : msg) test::expect_error([&] { s.validate(kH, kIs); }, {piece}, k.label);
    // The CPU backend refuses such weights before any work.
    MoeWeights w = make_synthetic_moe(c, 3);
    w.shared = s;
    EXPECT_ERROR_CONTAINS(Moe(w, MoeOptions{}), "SharedExpertWeights", msg[0]);
    const std::vector<float> x(static_cast<size_t>(kH), 1.0f);
    std::vector<float> out(static_cast<size_t>(kH));
    EXPECT_ERROR_CONTAINS(cpu::run_shared_expert(c, s, x.data(), 1, out.data(), 1), msg[0]);
  }
}

}  // namespace
}  // namespace nvfp4moe
