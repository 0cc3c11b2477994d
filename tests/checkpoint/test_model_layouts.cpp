// Both checkpoint layouts through one loader: a DeepSeek-layout model
// directory (sharded, FP8 shared experts with F8_E8M0 tile scales, an MTP
// block with MXFP4 experts, MIXED_PRECISION manifest) and its Hugging Face
// twin load to the weights they were written from, run on the CPU backend to
// identical outputs, and load the MXFP4 MTP block.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::FixtureModel;
using test::ScratchDir;

using ModelLayouts = test::ModelDirsTest;

TEST_F(ModelLayouts, LayoutIsToldFromTheTensorNames) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const ModelDir da(a()), db(b());
  EXPECT_EQ(da.layout(), CheckpointLayout::DeepSeek);
  EXPECT_EQ(db.layout(), CheckpointLayout::HuggingFace);
  EXPECT_EQ(da.config_name(), "config.json");
  EXPECT_EQ(da.quant_algo(), "MIXED_PRECISION");
  EXPECT_EQ(db.quant_algo(), "NVFP4");
  EXPECT_EQ(std::string(layout_name(da.layout())), "deepseek");
  EXPECT_EQ(parse_layout("huggingface"), CheckpointLayout::HuggingFace);
  EXPECT_ERROR_CONTAINS(parse_layout("hf"), "unknown checkpoint layout \"hf\"");
  // One tensor of the other layout makes a checkpoint ambiguous.
  SafetensorsWriter w;
  const std::vector<float> one = {1.0f};
  w.add("model.layers.0.mlp.gate.weight", DType::F32, {1}, one.data());
  w.add("layers.0.ffn.gate.weight", DType::F32, {1}, one.data());
  w.add("embed.weight", DType::F32, {1}, one.data());
  w.write(dir_ / "mixed.safetensors");
  EXPECT_ERROR_CONTAINS(ModelDir(dir_ / "mixed.safetensors"), "mixes the Hugging Face layout",
                        "(tensor \"model.layers.0.mlp.gate.weight\")", "the DeepSeek layout",
                        "(tensor \"layers.0.ffn.gate.weight\")");
}

TEST_F(ModelLayouts, EveryMainLayerOfBothLayoutsLoadsToTheWrittenWeights) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const ModelDir da(a()), db(b());
  for (int L = 0; L < FixtureModel::kLayers; ++L) {
    SCOPED_TRACE("layer " + std::to_string(L));
    test::expect_same_layer(load_moe_layer(da, L), model_.layers[size_t(L)]);
    test::expect_same_layer(load_moe_layer(db, L), model_.layers[size_t(L)]);
  }
  // The hash layer has no bias in the DeepSeek layout: zeros, as without one.
  EXPECT_FALSE(da.has("layers.0.ffn.gate.bias"));
  EXPECT_TRUE(da.has("layers.0.ffn.gate.tid2eid"));
  // Layer 1 is split over two shards.
  EXPECT_TRUE(da.has("layers.1.ffn.experts.0.w1.weight") && da.has("layers.1.ffn.experts.7.w2.weight"));
}

TEST_F(ModelLayouts, BothLayoutsRunToIdenticalOutputsOnTheCpu) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  test::Rng rng(seed_ ^ 0x5eed);
  const int64_t T = 6, H = model_.config.hidden;
  const std::vector<float> x = test::random_normal(rng, T * H);
  std::vector<int32_t> tokens;
  for (int64_t t = 0; t < T; ++t) tokens.push_back(int32_t(rng.below(FixtureModel::kVocab)));
  for (int L = 0; L < FixtureModel::kLayers; ++L) {
    SCOPED_TRACE("layer " + std::to_string(L));
    Moe ma(load_moe_layer(ModelDir(a()), L), MoeOptions{}), mb(load_moe_layer(ModelDir(b()), L), MoeOptions{});
    HostBatch batch{x, T};
    batch.token_ids = std::span<const int32_t>(tokens);
    const HostResult ra = ma.forward_host(batch), rb = mb.forward_host(batch);
    const std::vector<int32_t>&ids_a = ra.topk_ids, &ids_b = rb.topk_ids;
    const std::vector<float>&wa = ra.topk_weights, &wb = rb.topk_weights, &ya = ra.y, &yb = rb.y;
    EXPECT_EQ(ids_a, ids_b);
    EXPECT_EQ(wa, wb);
    ASSERT_EQ(ya.size(), yb.size());
    for (size_t i = 0; i < ya.size(); ++i) ASSERT_EQ(ya[i], yb[i]) << "element " << i;
    if (L == 0) {  // the hash layer routes by tid2eid
      for (int64_t t = 0; t < T; ++t)
        EXPECT_EQ(ids_a[size_t(2 * t)], model_.layers[0].router.tid2eid[size_t(2 * tokens[size_t(t)])]);
    }
    const std::vector<double> ref = test::reference_moe_f64(model_.layers[size_t(L)], x, T, ids_a, wa);
    EXPECT_LT(test::rel_l2(ya, ref), 1e-2);
  }
}

TEST_F(ModelLayouts, MtpBlockConfigAndTheOtherLayersLoad) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const ModelDir da(a());
  // The MXFP4 MTP block loads (tests/checkpoint/test_mxfp4_mtp.cpp checks its values).
  EXPECT_EQ(load_moe_layer(da, 0, LoadOptions{.mtp = true}).experts.format, ExpertFormat::Mxfp4);
  // Its config is readable (MTP blocks are never hash-routed); a second block does not exist.
  EXPECT_FALSE(read_moe_config(da, 0, true).hash_routed);
  EXPECT_ERROR_CONTAINS(read_moe_config(da, 1, true), "MTP block 1 does not exist",
                        "key \"num_nextn_predict_layers\"", "is 1");
  EXPECT_ERROR_CONTAINS(read_moe_config(da, 3), "layer 3 does not exist", "key \"num_hidden_layers\"", "is 3");
  for (int L = 0; L < FixtureModel::kLayers; ++L) EXPECT_NO_THROW(load_moe_layer(da, L)) << "layer " << L;
  // The Hugging Face layout has no MTP names at all.
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(b()), 0, LoadOptions{.mtp = true}), "MTP block 0",
                        "Hugging Face layout has no MTP block names");
}

TEST_F(ModelLayouts, RoutedExpertsInOtherFormatsAreRefusedNamingFormatAndLayer) {
  // FP8 and BF16 experts in layer 2, MXFP4 in one expert of layer 1.
  test::replace_in_model(a(), "layers.1.ffn.experts.5.w2.weight_scale", DType::U8, {}, {});
  test::replace_in_model(a(), "layers.1.ffn.experts.5.w2.weight_scale_2", DType::U8, {}, {});
  test::replace_in_model(a(), "layers.1.ffn.experts.5.w2.scale", DType::F8E8M0, {256, 5},
                         std::vector<uint8_t>(256 * 5, 127));
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(a()), 1), "layers.1 (layer 1): routed experts are MXFP4",
                        "layers.1.ffn.experts.5.w2.weight U8 [256, 80]");
  for (const char* suffix : {".weight_scale", ".weight_scale_2", ".input_scale"})
    test::replace_in_model(a(), std::string("layers.2.ffn.experts.0.w1") + suffix, DType::U8, {}, {});
  test::replace_in_model(a(), "layers.2.ffn.experts.0.w1.weight", DType::F8E4M3, {160, 256},
                         std::vector<uint8_t>(160 * 256, 0x38));
  test::replace_in_model(a(), "layers.2.ffn.experts.0.w1.weight_scale_inv", DType::F32, {2, 2},
                         test::as_bytes(std::vector<float>(4, 1.0f)));
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(a()), 2), "layers.2 (layer 2): routed experts are FP8",
                        ".weight_scale_inv F32 [2, 2]");
  test::replace_in_model(a(), "layers.2.ffn.experts.0.w1.weight_scale_inv", DType::U8, {}, {});
  test::replace_in_model(a(), "layers.2.ffn.experts.0.w1.weight", DType::BF16, {160, 256},
                         std::vector<uint8_t>(160 * 256 * 2, 0));
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(a()), 2), "routed experts are BF16");
  EXPECT_NO_THROW(load_moe_layer(ModelDir(a()), 0));  // the other layers still load
}

TEST_F(ModelLayouts, DeepSeekInferenceConfigKeysGiveTheSameConfig) {
  std::filesystem::rename(a() + "/config.json", a() + "/config.json.off");
  const ModelDir da(a());
  EXPECT_EQ(da.config_name(), "inference/config.json");
  for (int L = 0; L < FixtureModel::kLayers; ++L) {
    const MoeConfig c = read_moe_config(da, L);
    EXPECT_EQ(c.hidden, 256);
    EXPECT_EQ(c.intermediate, 160);
    EXPECT_EQ(c.experts, 8);
    EXPECT_EQ(c.top_k, 2);
    EXPECT_EQ(c.shared_experts, 1);
    EXPECT_EQ(c.routed_scaling_factor, 1.5f);
    EXPECT_EQ(c.swiglu_limit, std::optional<float>(10.0f));
    EXPECT_EQ(c.hash_routed, L == 0);  // n_hash_layers = 1
  }
  test::expect_same_layer(load_moe_layer(da, 2), model_.layers[2]);
  EXPECT_ERROR_CONTAINS(read_moe_config(da, 3), "inference/config.json", "key \"n_layers\"");
}

// A directory holding only a config.json.
std::string config_only(const ScratchDir& d, const std::string& name, const std::string& text) {
  std::filesystem::create_directories(d / name);
  test::write_text(d / (name + "/config.json"), text);
  SafetensorsWriter().write(d / (name + "/model.safetensors"));
  return d / name;
}

TEST(ModelConfigKeys, EitherSpellingAndDisagreementsAreNamed) {
  ScratchDir d;
  const std::string both = config_only(d, "both", R"({"hidden_size": 64, "dim": 64, "moe_intermediate_size": 32,
      "n_routed_experts": 8, "num_experts_per_tok": 2, "n_activated_experts": 2, "route_scale": 2.5,
      "score_func": "sigmoid", "n_hash_layers": 2, "swiglu_limit": 0})");
  const MoeConfig c = read_moe_config(ModelDir(both), 2);
  EXPECT_EQ(c.routed_scaling_factor, 2.5f);
  EXPECT_EQ(c.scoring, Scoring::Sigmoid);
  EXPECT_FALSE(c.swiglu_limit.has_value());  // 0: no clamp
  EXPECT_FALSE(c.hash_routed);
  EXPECT_TRUE(read_moe_config(ModelDir(both), 1).hash_routed);
  const std::string bad = config_only(d, "bad", R"({"hidden_size": 64, "dim": 128, "moe_intermediate_size": 32,
      "n_routed_experts": 8, "num_experts_per_tok": 2})");
  EXPECT_ERROR_CONTAINS(read_moe_config(ModelDir(bad), 0), "keys \"hidden_size\" (64) and \"dim\" (128) disagree");
  const std::string none = config_only(d, "none", R"({"moe_intermediate_size": 32, "n_routed_experts": 8,
      "num_experts_per_tok": 2})");
  EXPECT_ERROR_CONTAINS(read_moe_config(ModelDir(none), 0), "missing key \"hidden_size\" (or \"dim\")");
  const std::string neg = config_only(d, "neg", R"({"dim": 64, "moe_inter_dim": 32, "n_routed_experts": 8,
      "n_activated_experts": 2, "swiglu_limit": -1, "score_func": "relu"})");
  EXPECT_ERROR_CONTAINS(read_moe_config(ModelDir(neg), 0), "key \"swiglu_limit\" is -1");
}

}  // namespace
}  // namespace nvfp4moe
