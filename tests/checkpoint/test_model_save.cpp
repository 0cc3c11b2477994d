// save_moe_layer keeps the layout it is given: a layer read from a
// DeepSeek-layout directory is written back under the same names, shapes and
// (but for the router gate, written F32) dtypes as the official files, with
// DeepSeek's config keys and ModelOpt's MIXED_PRECISION manifest; the same for
// the Hugging Face layout; and either reads back to the same weights.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "support/shared_fp8_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::FixtureModel;
using test::ScratchDir;

struct Meta {
  DType dtype;
  std::vector<int64_t> shape;
};

// The tensors of one MoE block (names under `ffn`), as name -> dtype and shape.
std::map<std::string, Meta> block_tensors(const ModelDir& d, const std::string& ffn) {
  std::map<std::string, Meta> r;
  for (const std::string& n : d.tensor_names())
    if (n.compare(0, ffn.size(), ffn) == 0) r[n] = Meta{d.get(n).dtype, d.get(n).shape};
  return r;
}

std::string text_of(const std::string& path) {
  const std::vector<uint8_t> b = test::read_bytes(path);
  return std::string(b.begin(), b.end());
}

float scalar(const ModelDir& d, const std::string& name) {
  float v;
  std::memcpy(&v, d.get(name).data, 4);
  return v;
}

void expect_same_names(const ModelDir& saved, const ModelDir& official, const std::string& ffn) {
  const std::map<std::string, Meta> a = block_tensors(saved, ffn), b = block_tensors(official, ffn);
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [name, m] : b) {
    SCOPED_TRACE(name);
    auto it = a.find(name);
    ASSERT_NE(it, a.end()) << "not written";
    EXPECT_EQ(it->second.shape, m.shape);
    if (name.find("gate.weight") == std::string::npos) {
      EXPECT_EQ(dtype_name(it->second.dtype), dtype_name(m.dtype));
    }
  }
}

TEST(ModelSave, EachLayoutIsWrittenBackUnderItsOwnNames) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const FixtureModel model = test::make_fixture_model(seed);
  ScratchDir d;
  test::write_deepseek_layout(model, d / "a");
  test::write_huggingface_layout(model, d / "b");
  for (int L : {0, 1}) {  // the hash layer and a scored one
    SCOPED_TRACE("layer " + std::to_string(L));
    const std::string ds = "layers." + std::to_string(L) + ".ffn.", hf = "model.layers." + std::to_string(L) + ".mlp.";
    const std::string out_a = d / (std::string("a") += std::to_string(L)), out_b = d / (std::string("b") += std::to_string(L));
    save_moe_layer(out_a, L, load_moe_layer(ModelDir(d / "a"), L), SaveOptions{CheckpointLayout::DeepSeek});
    save_moe_layer(out_b, L, load_moe_layer(ModelDir(d / "b"), L), SaveOptions{CheckpointLayout::HuggingFace});
    const ModelDir sa(out_a), sb(out_b);
    EXPECT_EQ(sa.layout(), CheckpointLayout::DeepSeek);
    EXPECT_EQ(sb.layout(), CheckpointLayout::HuggingFace);
    expect_same_names(sa, ModelDir(d / "a"), ds);
    expect_same_names(sb, ModelDir(d / "b"), hf);
    test::expect_same_layer(load_moe_layer(sa, L), model.layers[size_t(L)]);
    test::expect_same_layer(load_moe_layer(sb, L), model.layers[size_t(L)]);
    // w1 and w3 of an expert carry the one weight_scale_2 they were quantized with.
    EXPECT_EQ(scalar(sa, ds + "experts.3.w1.weight_scale_2"), scalar(sa, ds + "experts.3.w3.weight_scale_2"));
    EXPECT_EQ(sa.get(ds + "shared_experts.w2.scale").dtype, DType::F8E8M0);
    EXPECT_EQ(sb.get(hf + "shared_experts.down_proj.weight_scale_inv").dtype, DType::F32);
  }
}

TEST(ModelSave, DeepSeekConfigAndManifestAsModelOptWritesThem) {
  const FixtureModel model = test::make_fixture_model(11);
  ScratchDir d;
  test::write_deepseek_layout(model, d / "a");
  save_moe_layer(d / "h", 0, load_moe_layer(ModelDir(d / "a"), 0), SaveOptions{CheckpointLayout::DeepSeek});
  save_moe_layer(d / "s", 2, load_moe_layer(ModelDir(d / "a"), 2), SaveOptions{CheckpointLayout::DeepSeek});
  const json::Value h = json::parse(text_of(d / "h/config.json")), s = json::parse(text_of(d / "s/config.json"));
  EXPECT_EQ(h.find("num_hash_layers")->as_int(), 1);
  EXPECT_EQ(s.find("num_hash_layers")->as_int(), 0);
  EXPECT_EQ(s.find("num_hidden_layers")->as_int(), 3);
  EXPECT_EQ(s.find("mlp_layer_types"), nullptr);
  const json::Value* qc = s.find("quantization_config");
  ASSERT_NE(qc, nullptr);
  EXPECT_EQ(qc->find("quant_method")->as_string(), "fp8");
  EXPECT_EQ(qc->find("moe_quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(qc->find("quantized_layers")->find("layers.2.ffn.experts")->find("quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(qc->find("ignore")->items().size(), 4u);
  const json::Value hq = json::parse(text_of(d / "s/hf_quant_config.json"));
  const json::Value* q = hq.find("quantization");
  EXPECT_EQ(q->find("quant_algo")->as_string(), "MIXED_PRECISION");
  EXPECT_EQ(q->find("quantized_layers")->find("layers.2.ffn.experts")->find("group_size")->as_int(), 16);
  EXPECT_EQ(q->find("exclude_modules")->items()[3].as_string(), "mtp.*");
  const ModelDir sd(d / "s");
  EXPECT_EQ(sd.quant_algo(), "MIXED_PRECISION");
  EXPECT_EQ(sd.quant_manifest().moe_quant_algo, "NVFP4");
  EXPECT_EQ(sd.quant_manifest().algo_of("layers.2.ffn.experts"), "NVFP4");
  EXPECT_EQ(sd.quant_manifest().algo_of("layers.2.ffn.shared_experts"), "");
  EXPECT_EQ(sd.quant_manifest().algo_of("mtp.0.ffn.experts"), "");
  EXPECT_FALSE(read_moe_config(sd, 2).hash_routed);
  EXPECT_TRUE(read_moe_config(ModelDir(d / "h"), 0).hash_routed);
  EXPECT_FALSE(sd.has("layers.0.ffn.gate.bias"));
  EXPECT_FALSE(ModelDir(d / "h").has("layers.0.ffn.gate.bias"));  // a hash layer's gate has no bias
}

TEST(ModelSave, ArbitraryTileFactorsAndSeparateGateUpScalesSurvive) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  FixtureModel model = test::make_fixture_model(seed);
  MoeWeights w = model.layers[1];
  w.shared = test::random_fp8_shared(rng, 256, 160, test::TileScales::Arbitrary);
  w.experts.w13_global[2 * 4 + 1] *= 2.0f;  // expert 4: up's g differs from gate's
  ScratchDir d;
  for (CheckpointLayout layout : {CheckpointLayout::DeepSeek, CheckpointLayout::HuggingFace}) {
    SCOPED_TRACE(layout_name(layout));
    const std::string out = d / layout_name(layout);
    save_moe_layer(out, 1, w, SaveOptions{layout});
    const ModelDir sd(out);
    const std::string scale = layout == CheckpointLayout::DeepSeek ? "layers.1.ffn.shared_experts.w1.scale"
                                                                   : "model.layers.1.mlp.shared_experts.gate_proj.weight_scale_inv";
    EXPECT_EQ(sd.get(scale).dtype, DType::F32);  // not powers of two: no E8M0 bytes
    const MoeWeights r = load_moe_layer(sd, 1);
    test::expect_same_layer(r, w);
    EXPECT_EQ(r.experts.w13_global[2 * 4 + 1], 2.0f * r.experts.w13_global[2 * 4]);
  }
}

TEST(ModelSave, FloatConfigValuesAreWrittenAsFloats) {
  // transformers' DeepseekV4Config declares routed_scaling_factor and
  // swiglu_limit float and refuses the integer 10.
  const FixtureModel model = test::make_fixture_model(7);
  MoeWeights w = model.layers[1];
  w.config.routed_scaling_factor = 2.0f;
  w.config.swiglu_limit = 10.0f;
  ScratchDir d;
  for (CheckpointLayout layout : {CheckpointLayout::DeepSeek, CheckpointLayout::HuggingFace}) {
    SCOPED_TRACE(layout_name(layout));
    const std::string out = d / layout_name(layout);
    save_moe_layer(out, 1, w, SaveOptions{layout});
    const std::string text = text_of(out + "/config.json");
    EXPECT_NE(text.find("\"swiglu_limit\": 10.0,"), std::string::npos) << text;
    EXPECT_NE(text.find("\"routed_scaling_factor\": 2.0,"), std::string::npos) << text;
    EXPECT_NE(text.find("\"hidden_size\": 256,"), std::string::npos) << text;  // integers stay integers
    const json::Value c = json::parse(text);
    EXPECT_FALSE(c.find("swiglu_limit")->is_integer());
    EXPECT_FALSE(c.find("routed_scaling_factor")->is_integer());
    const MoeConfig r = read_moe_config(ModelDir(out), 1);
    EXPECT_EQ(r.routed_scaling_factor, 2.0f);
    EXPECT_EQ(r.swiglu_limit.value_or(0.0f), 10.0f);
  }
}

TEST(ModelSave, TheHuggingFaceLayoutStaysTheDefault) {
  const FixtureModel model = test::make_fixture_model(5);
  ScratchDir d;
  save_moe_layer(d.path(), 2, model.layers[2]);
  const ModelDir sd(d.path());
  EXPECT_EQ(sd.layout(), CheckpointLayout::HuggingFace);
  EXPECT_EQ(sd.quant_algo(), "NVFP4");
  EXPECT_TRUE(sd.has("model.layers.2.mlp.shared_experts.up_proj.weight_scale_inv"));
  test::expect_same_layer(load_moe_layer(sd, 2), model.layers[2]);
}

}  // namespace
}  // namespace nvfp4moe
