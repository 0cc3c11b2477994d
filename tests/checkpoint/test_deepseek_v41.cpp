// A DeepSeek-V4.1 model directory written here from the facts of
// docs/checkpoints.md ("DeepSeek-V4.1"): config.json with the language
// model's keys in text_config beside a vision_config, no hash-routed layers,
// MXFP4 routed experts as in V4, FP8 E4M3 shared experts with one F8_E8M0
// factor per 32 x 32 block, a router bias on every layer plus its
// bias_vl for image tokens, and a DSpark draft block mtp.0. Its main
// layers load (the shared expert as its exact BF16 values) and run on the
// CPU within the tolerance of the FP64 reference; its draft blocks, a scale
// of neither block size, mixed block sizes and a product BF16 cannot hold
// are refused naming what is wrong.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

constexpr int64_t kH = 128, kI = 64, kE = 4, kK = 2, kLayers = 2, kBlock = 32;

int64_t blocks(int64_t n) { return (n + kBlock - 1) / kBlock; }

struct Fp8Proj {
  std::vector<uint8_t> weight, scale;  // F8_E4M3 [N, K], F8_E8M0 [ceil(N/32), ceil(K/32)]
  int64_t N = 0, K = 0;
  std::vector<int64_t> scale_shape;    // as written; empty: [ceil(N/32), ceil(K/32)]
  // e4m3(weight[n, k]) x 2^(scale byte - 127): what the checkpoint means.
  float value(int64_t n, int64_t k) const {
    return fmt::e4m3_value(weight[size_t(n * K + k)]) *
           std::ldexp(1.0f, int(scale[size_t((n / kBlock) * blocks(K) + k / kBlock)]) - 127);
  }
};

Fp8Proj random_fp8(test::Rng& rng, int64_t N, int64_t K) {
  Fp8Proj p{std::vector<uint8_t>(size_t(N * K)), std::vector<uint8_t>(size_t(blocks(N) * blocks(K))), N, K};
  for (uint8_t& b : p.weight) {
    b = uint8_t(rng.next());
    if ((b & 0x7F) == 0x7F) b ^= 1;  // not the NaN byte
  }
  for (uint8_t& s : p.scale) s = uint8_t(118 + rng.below(12));
  return p;
}

struct V41Block {
  std::vector<std::vector<uint8_t>> codes, scales;  // per expert and projection (w1, w3, w2): I8 [N, K/2], E8M0 [N, K/32]
  Fp8Proj shared[3];                                 // w1, w3 [Is, H], w2 [H, Is]
  std::vector<Bf16> gate;                            // [E, H]
  std::vector<float> bias, bias_vl;                  // [E]
};

V41Block random_block(test::Rng& rng) {
  V41Block b;
  for (int64_t e = 0; e < kE; ++e)
    for (int p = 0; p < 3; ++p) {
      const int64_t N = p == 2 ? kH : kI, K = p == 2 ? kI : kH;
      std::vector<uint8_t> c(size_t(N * K / 2)), s(size_t(N * K / 32));
      for (uint8_t& v : c) v = uint8_t(rng.next());
      for (uint8_t& v : s) v = uint8_t(118 + rng.below(8));
      b.codes.push_back(std::move(c));
      b.scales.push_back(std::move(s));
    }
  b.shared[0] = random_fp8(rng, kI, kH);
  b.shared[1] = random_fp8(rng, kI, kH);
  b.shared[2] = random_fp8(rng, kH, kI);
  for (int64_t i = 0; i < kE * kH; ++i) b.gate.push_back(bf16_from_float(float(rng.normal()) * 0.1f));
  for (int64_t e = 0; e < kE; ++e) {
    b.bias.push_back(float(rng.normal()) * 0.1f);
    b.bias_vl.push_back(5.0f + float(e));  // would reorder the routing if it were read
  }
  return b;
}

const char* const kProj[3] = {"w1", "w3", "w2"};

void add_block(SafetensorsWriter& w, const std::string& block, const V41Block& b) {
  const std::string ffn = block + ".ffn.";
  for (int64_t e = 0; e < kE; ++e)
    for (int p = 0; p < 3; ++p) {
      const int64_t N = p == 2 ? kH : kI, K = p == 2 ? kI : kH;
      const std::string name = ffn + "experts." + std::to_string(e) + "." + kProj[p];
      w.add(name + ".weight", DType::I8, {N, K / 2}, b.codes[size_t(3 * e + p)].data());
      w.add(name + ".scale", DType::F8E8M0, {N, K / 32}, b.scales[size_t(3 * e + p)].data());
    }
  for (int p = 0; p < 3; ++p) {
    const Fp8Proj& s = b.shared[p];
    w.add(ffn + "shared_experts." + kProj[p] + ".weight", DType::F8E4M3, {s.N, s.K}, s.weight.data());
    const std::vector<int64_t> shape =
        s.scale_shape.empty() ? std::vector<int64_t>{blocks(s.N), blocks(s.K)} : s.scale_shape;
    w.add(ffn + "shared_experts." + kProj[p] + ".scale", DType::F8E8M0, shape, s.scale.data());
  }
  w.add(ffn + "gate.weight", DType::BF16, {kE, kH}, b.gate.data());
  w.add(ffn + "gate.bias", DType::F32, {kE}, b.bias.data());
  w.add(ffn + "gate.bias_vl", DType::F32, {kE}, b.bias_vl.data());
}

const char* const kConfig = R"({
  "architectures": ["DeepseekV41ForCausalLM"],
  "model_type": "deepseek_v41",
  "image_token_id": 129264,
  "text_config": {
    "model_type": "deepseek_v41_text",
    "hidden_size": 128, "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "scoring_func": "sqrtsoftplus", "topk_method": "noaux_tc", "norm_topk_prob": true,
    "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "hidden_act": "silu", "num_hidden_layers": 2,
    "num_nextn_predict_layers": 3, "dspark_n_routed_experts": 4, "dspark_num_experts_per_tok": 1,
    "engram_layer_ids": [1]
  },
  "vision_config": {"model_type": "deepseek_v41_vision"},
  "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                          "scale_fmt": "ue8m0", "expert_dtype": "fp4"}
})";

class DeepseekV41 : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = test::fresh_seed();
    test::Rng rng(seed_);
    for (int L = 0; L < kLayers; ++L) layers_.push_back(random_block(rng));
    draft_ = random_block(rng);
    write();
  }
  void write() {
    SafetensorsWriter w;
    for (int L = 0; L < kLayers; ++L) add_block(w, "layers." + std::to_string(L), layers_[size_t(L)]);
    add_block(w, "mtp.0", draft_);
    w.write(dir_ / "model.safetensors");
    test::write_text(dir_ / "config.json", kConfig);
  }
  std::string dir() const { return dir_.path(); }
  uint64_t seed_ = 0;
  std::vector<V41Block> layers_;
  V41Block draft_;
  ScratchDir dir_;
};

TEST_F(DeepseekV41, ConfigIsReadFromTextConfigWithoutHashLayers) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const ModelDir d(dir());
  EXPECT_EQ(d.layout(), CheckpointLayout::DeepSeek);
  for (int L = 0; L < kLayers; ++L) {
    const MoeConfig c = read_moe_config(d, L);
    EXPECT_EQ(c.hidden, kH);
    EXPECT_EQ(c.intermediate, kI);
    EXPECT_EQ(c.experts, kE);
    EXPECT_EQ(c.top_k, kK);
    EXPECT_EQ(c.shared_experts, 1);
    EXPECT_EQ(c.routed_scaling_factor, 1.5f);
    EXPECT_EQ(c.swiglu_limit, 10.0f);
    EXPECT_EQ(c.scoring, Scoring::SqrtSoftplus);
    EXPECT_FALSE(c.hash_routed) << "layer " << L << ": DeepSeek-V4.1 has no hash layers";
  }
  EXPECT_ERROR_CONTAINS(read_moe_config(d, 2), "(text_config): layer 2 does not exist");
  EXPECT_ERROR_CONTAINS(read_moe_config(d, 0, true), "DeepSeek-V4.1's draft blocks mtp.N (DSpark",
                        "are not read yet");
  EXPECT_ERROR_CONTAINS(load_moe_layer(d, 0, LoadOptions{.mtp = true}), "DSpark");
}

TEST_F(DeepseekV41, MainLayersLoadWithTheSharedExpertAsItsExactBf16Values) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const ModelDir d(dir());
  for (int L = 0; L < kLayers; ++L) {
    SCOPED_TRACE("layer " + std::to_string(L));
    const V41Block& b = layers_[size_t(L)];
    const MoeWeights w = load_moe_layer(d, L);
    ASSERT_EQ(w.shared.format, SharedExpertFormat::Bf16);
    const std::vector<Bf16>* got[3] = {&w.shared.w1, &w.shared.w3, &w.shared.w2};
    for (int p = 0; p < 3; ++p) {
      const Fp8Proj& s = b.shared[p];
      ASSERT_EQ(got[p]->size(), size_t(s.N * s.K));
      for (int64_t n = 0; n < s.N; ++n)
        for (int64_t k = 0; k < s.K; ++k)
          ASSERT_EQ(bf16_to_float((*got[p])[size_t(n * s.K + k)]), s.value(n, k))
              << kProj[p] << " (" << n << ", " << k << ")";
    }
    EXPECT_EQ(w.experts.format, ExpertFormat::Mxfp4);
    ASSERT_EQ(w.experts.count, kE);
    for (int64_t e = 0; e < kE; ++e) {  // w13: gate rows, then up rows; w2 as written
      const size_t gate = size_t(kI * kH / 2), sg = size_t(kI * kH / 32);
      const uint8_t* c13 = w.experts.w13_codes.data() + size_t(e) * 2 * gate;
      const uint8_t* s13 = w.experts.w13_scales.data() + size_t(e) * 2 * sg;
      EXPECT_TRUE(std::equal(b.codes[size_t(3 * e)].begin(), b.codes[size_t(3 * e)].end(), c13));
      EXPECT_TRUE(std::equal(b.codes[size_t(3 * e + 1)].begin(), b.codes[size_t(3 * e + 1)].end(), c13 + gate));
      EXPECT_TRUE(std::equal(b.scales[size_t(3 * e)].begin(), b.scales[size_t(3 * e)].end(), s13));
      EXPECT_TRUE(std::equal(b.scales[size_t(3 * e + 1)].begin(), b.scales[size_t(3 * e + 1)].end(), s13 + sg));
      EXPECT_TRUE(std::equal(b.codes[size_t(3 * e + 2)].begin(), b.codes[size_t(3 * e + 2)].end(),
                             w.experts.w2_codes.data() + size_t(e) * gate));
    }
    ASSERT_EQ(w.router.gate.size(), size_t(kE * kH));
    for (size_t i = 0; i < w.router.gate.size(); ++i) ASSERT_EQ(w.router.gate[i], bf16_to_float(b.gate[i]));
    EXPECT_EQ(w.router.bias, b.bias) << "the text bias, not bias_vl";
    EXPECT_TRUE(w.router.tid2eid.empty());
  }
}

TEST_F(DeepseekV41, MainLayerRunsOnTheCpuWithinTheReference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  test::Rng rng(seed_ ^ 0x41);
  const int64_t T = 5;
  const std::vector<float> x = test::random_normal(rng, T * kH);
  for (int L = 0; L < kLayers; ++L) {
    SCOPED_TRACE("layer " + std::to_string(L));
    const MoeWeights w = load_moe_layer(ModelDir(dir()), L);
    Moe moe(w, MoeOptions{});
    const HostResult r = moe.forward_host(HostBatch{x, T});
    const std::vector<double> ref = test::reference_moe_f64(w, x, T, r.topk_ids, r.topk_weights);
    EXPECT_LT(test::rel_l2(r.y, ref), 1e-2);
  }
}

TEST_F(DeepseekV41, SharedScalesOfAnotherShapeMixedOrInexactAreRefused) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::string shared = "layers.0.ffn.shared_experts.";
  Fp8Proj& gate = layers_[0].shared[0];  // [64, 128]
  Fp8Proj& down = layers_[0].shared[2];  // [128, 64]
  const Fp8Proj gate_kept = gate, down_kept = down;
  // Neither 128x128 nor 32x32 blocks.
  gate.scale.assign(32, 127);
  gate.scale_shape = {4, 8};
  write();
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(dir()), 0),
                        "tensor \"" + shared + "w1.scale\": shape [4, 8], expected [1, 1] (128x128 tiles) or [2, 4] "
                        "(32x32 tiles) for the weight [64, 128]");
  gate = gate_kept;
  // One projection with 128x128 tiles beside 32x32 blocks.
  down.scale.assign(1, 127);
  down.scale_shape = {1, 1};
  write();
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(dir()), 0), "the shared expert mixes block sizes",
                        shared + "w1 has 32x32 blocks, " + shared + "w2 128x128");
  down = down_kept;
  // E4M3 0x01 (2^-9) times 2^-126 is 2^-135: below what a BF16 holds.
  gate.weight[0] = 0x01;
  gate.scale[0] = 1;
  write();
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(dir()), 0), "tensor \"" + shared + "w1.weight\": element (0, 0) times "
                        "its block scale is", "not exact in BF16");
  gate = gate_kept;
  write();
  EXPECT_NO_THROW(load_moe_layer(ModelDir(dir()), 0));
}

// inspect's per-layer summary: the main layers' shared experts as FP8 with
// 32x32 blocks (their factors' range read), loadable; the draft block named
// as not read yet.
TEST_F(DeepseekV41, SummaryShowsTheBlockSizeAndTheDraftBlock) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<MoeLayerSummary> s = summarize_moe_layers(ModelDir(dir()));
  ASSERT_EQ(s.size(), size_t(kLayers + 1));
  for (const MoeLayerSummary& l : s) {
    SCOPED_TRACE(l.block);
    EXPECT_EQ(l.routed_format, "MXFP4");
    EXPECT_EQ(l.shared_format, "FP8 32x32");
    EXPECT_EQ(l.router, "scored");
    EXPECT_TRUE(l.bias);
    EXPECT_EQ(l.shared_scale.count, 2 * 2 * 4 + 4 * 2);
    EXPECT_GE(l.shared_scale.min, std::ldexp(1.0f, 118 - 127));  // the bytes drawn: 118 .. 129
    EXPECT_LE(l.shared_scale.max, std::ldexp(1.0f, 129 - 127));
    if (!l.mtp) {
      EXPECT_TRUE(l.loadable);
      EXPECT_TRUE(l.problems.empty()) << (l.problems.empty() ? "" : l.problems[0]);
    } else {
      EXPECT_FALSE(l.loadable);
      ASSERT_FALSE(l.problems.empty());
      EXPECT_NE(l.problems[0].find("DSpark"), std::string::npos) << l.problems[0];
    }
  }
}

}  // namespace
}  // namespace nvfp4moe
