// save_moe_layer / load_moe_layer / read_moe_config / ModelDir: round trips
// on fresh random weights, expert-parallel slices, hash-routed layers, the
// hash-layer rules of docs/numerics.md §4, sharded directories and every bad checkpoint
// (missing tensor, wrong shape/dtype, NaN or non-positive global scale).
#include <cmath>
#include <cstring>
#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

MoeConfig tiny_config() {
  MoeConfig c;
  c.hidden = 32;
  c.intermediate = 16;
  c.experts = 4;
  c.top_k = 2;
  c.shared_experts = 1;
  c.routed_scaling_factor = 2.5f;
  c.swiglu_limit = 7.0f;
  return c;
}

// Random but well-formed weights: codes any byte, scales positive UE4M3.
MoeWeights random_weights(const MoeConfig& c, test::Rng& rng, bool input_scales) {
  MoeWeights w;
  w.config = c;
  const int64_t H = c.hidden, I = c.intermediate, E = c.experts;
  ExpertWeights& ex = w.experts;
  ex.count = E;
  ex.hidden = H;
  ex.intermediate = I;
  auto bytes = [&](int64_t n, uint8_t mask) {
    std::vector<uint8_t> b(static_cast<size_t>(n));
    for (auto& x : b) x = uint8_t(rng.next()) & mask;
    for (auto& x : b)
      if (mask == 0x7F && x == 0x7F) x = 0x7E;  // no NaN scale
    return b;
  };
  ex.w13_codes = bytes(E * 2 * I * H / 2, 0xFF);
  ex.w13_scales = bytes(E * 2 * I * H / 16, 0x7F);
  ex.w2_codes = bytes(E * H * I / 2, 0xFF);
  ex.w2_scales = bytes(E * H * I / 16, 0x7F);
  for (int64_t e = 0; e < E; ++e) {
    ex.w13_global.push_back(rng.uniform(1e-4f, 1e-2f));
    ex.w13_global.push_back(rng.uniform(1e-4f, 1e-2f));
    ex.w2_global.push_back(rng.uniform(1e-4f, 1e-2f));
    if (input_scales) {
      ex.w13_input_scale.push_back(rng.uniform(1e-3f, 1e-1f));
      ex.w2_input_scale.push_back(rng.uniform(1e-3f, 1e-1f));
    }
  }
  w.router.gate = test::random_normal(rng, E * H);
  w.router.bias = test::random_normal(rng, E);
  const int64_t Is = c.shared_inter();
  for (auto* v : {&w.shared.w1, &w.shared.w3}) {
    for (int64_t i = 0; i < Is * H; ++i) v->push_back(bf16_from_float(rng.normal()));
  }
  for (int64_t i = 0; i < H * Is; ++i) w.shared.w2.push_back(bf16_from_float(rng.normal()));
  if (c.hash_routed) {
    w.router.vocab = 10;
    for (int64_t i = 0; i < w.router.vocab * c.top_k; ++i) w.router.tid2eid.push_back(int32_t(rng.below(E)));
  }
  return w;
}

void expect_same_experts(const ExpertWeights& a, const ExpertWeights& b) {
  EXPECT_EQ(a.count, b.count);
  EXPECT_EQ(a.first_expert, b.first_expert);
  ASSERT_EQ(a.w13_codes.size(), b.w13_codes.size());
  EXPECT_BYTES_EQ(a.w13_codes.data(), b.w13_codes.data(), int64_t(a.w13_codes.size()), "w13_codes");
  ASSERT_EQ(a.w13_scales.size(), b.w13_scales.size());
  EXPECT_BYTES_EQ(a.w13_scales.data(), b.w13_scales.data(), int64_t(a.w13_scales.size()), "w13_scales");
  ASSERT_EQ(a.w2_codes.size(), b.w2_codes.size());
  EXPECT_BYTES_EQ(a.w2_codes.data(), b.w2_codes.data(), int64_t(a.w2_codes.size()), "w2_codes");
  ASSERT_EQ(a.w2_scales.size(), b.w2_scales.size());
  EXPECT_BYTES_EQ(a.w2_scales.data(), b.w2_scales.data(), int64_t(a.w2_scales.size()), "w2_scales");
  EXPECT_EQ(a.w13_global, b.w13_global);
  EXPECT_EQ(a.w2_global, b.w2_global);
  EXPECT_EQ(a.w2_input_scale, b.w2_input_scale);
}

TEST(MoeLayerIo, SaveLoadRoundTrip) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const MoeConfig c = tiny_config();
  const MoeWeights w = random_weights(c, rng, true);
  ScratchDir dir;
  save_moe_layer(dir.path(), 5, w);
  ModelDir md(dir.path());
  EXPECT_EQ(md.quant_algo(), "NVFP4");
  MoeWeights r = load_moe_layer(md, 5);
  EXPECT_EQ(r.config.hidden, c.hidden);
  EXPECT_EQ(r.config.intermediate, c.intermediate);
  EXPECT_EQ(r.config.experts, c.experts);
  EXPECT_EQ(r.config.top_k, c.top_k);
  EXPECT_EQ(r.config.shared_experts, 1);
  EXPECT_EQ(r.config.routed_scaling_factor, 2.5f);
  EXPECT_EQ(r.config.swiglu_limit, std::optional<float>(7.0f));
  EXPECT_FALSE(r.config.hash_routed);  // layer 5 < 3 is false; mlp_layer_types says "moe" anyway
  EXPECT_EQ(r.config.l1_input, InputScaleMode::Dynamic);
  expect_same_experts(r.experts, w.experts);
  // Both gate and up get the saved input_scale, so the max is that value.
  EXPECT_EQ(r.experts.w13_input_scale, w.experts.w13_input_scale);
  EXPECT_EQ(r.router.gate, w.router.gate);
  EXPECT_EQ(r.router.bias, w.router.bias);
  EXPECT_TRUE(r.router.tid2eid.empty());
  EXPECT_EQ(std::memcmp(r.shared.w1.data(), w.shared.w1.data(), w.shared.w1.size() * 2), 0);
  EXPECT_EQ(std::memcmp(r.shared.w3.data(), w.shared.w3.data(), w.shared.w3.size() * 2), 0);
  EXPECT_EQ(std::memcmp(r.shared.w2.data(), w.shared.w2.data(), w.shared.w2.size() * 2), 0);

  // The ModelOpt names, dtypes and shapes of docs/numerics.md §4, checked directly.
  const TensorInfo& g = md.get("model.layers.5.mlp.experts.3.up_proj.weight");
  EXPECT_EQ(g.dtype, DType::U8);
  EXPECT_EQ(g.shape, (std::vector<int64_t>{16, 16}));
  EXPECT_EQ(md.get("model.layers.5.mlp.experts.3.down_proj.weight_scale").dtype, DType::F8E4M3);
  EXPECT_EQ(md.get("model.layers.5.mlp.experts.3.down_proj.weight_scale").shape, (std::vector<int64_t>{32, 1}));
  EXPECT_TRUE(md.get("model.layers.5.mlp.experts.0.gate_proj.weight_scale_2").shape.empty());
  // up_proj of expert 3 holds rows I..2I-1 of w13 for expert 3.
  EXPECT_BYTES_EQ(g.data, w.experts.w13_codes.data() + (3 * 2 + 1) * 16 * 16, 256, "expert 3 up rows");
}

TEST(MoeLayerIo, StaticL1InputScaleIsMaxOfGateAndUp) {
  test::Rng rng(7);
  const MoeWeights w = random_weights(tiny_config(), rng, true);
  ScratchDir dir;
  save_moe_layer(dir.path(), 0, w);
  // Make gate's and up's input_scale differ for expert 1: rewrite up's larger.
  {
    ModelDir md(dir.path());
    SafetensorsWriter st;
    std::vector<float> bigger = {1.0f};
    for (const auto& n : md.tensor_names()) {
      const TensorInfo& t = md.get(n);
      if (n == "model.layers.0.mlp.experts.1.up_proj.input_scale") st.add(n, DType::F32, {}, bigger.data());
      else st.add(n, t.dtype, t.shape, t.data);
    }
    st.write(dir / "model.safetensors");
  }
  MoeWeights r = load_moe_layer(ModelDir(dir.path()), 0, LoadOptions{.static_l1_input = true, .static_l2_input = true});
  EXPECT_EQ(r.config.l1_input, InputScaleMode::Static);
  EXPECT_EQ(r.config.l2_input, InputScaleMode::Static);
  ASSERT_EQ(r.experts.w13_input_scale.size(), 4u);
  EXPECT_EQ(r.experts.w13_input_scale[1], 1.0f);
  EXPECT_EQ(r.experts.w13_input_scale[0], w.experts.w13_input_scale[0]);
}

TEST(MoeLayerIo, ExpertParallelSliceIsLocallyIndexed) {
  test::Rng rng(test::fresh_seed());
  const MoeWeights w = random_weights(tiny_config(), rng, false);
  ScratchDir dir;
  save_moe_layer(dir.path(), 3, w);
  MoeWeights r = load_moe_layer(ModelDir(dir.path()), 3, LoadOptions{.first_expert = 2, .expert_count = 2});
  expect_same_experts(r.experts, w.experts.slice(2, 2));
  EXPECT_EQ(r.experts.first_expert, 2);
  EXPECT_TRUE(r.experts.w13_input_scale.empty());
  EXPECT_EQ(r.router.gate.size(), size_t(4 * 32));  // the router stays global
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(dir.path()), 3, LoadOptions{.first_expert = 3, .expert_count = 2}),
                        "experts [3, 5) outside [0, E=4)");
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(dir.path()), 3, LoadOptions{.static_l1_input = true}),
                        "static L1 input scale requested", "experts.0.gate_proj.input_scale");
}

TEST(MoeLayerIo, HashRoutedLayerRoundTrip) {
  test::Rng rng(test::fresh_seed());
  MoeConfig c = tiny_config();
  c.hash_routed = true;
  c.shared_experts = 0;
  const MoeWeights w = random_weights(c, rng, false);
  ScratchDir dir;
  save_moe_layer(dir.path(), 4, w);
  ModelDir md(dir.path());
  json::Value cfg = json::parse(md.config_json());
  const auto& types = cfg.find("mlp_layer_types")->items();
  ASSERT_EQ(types.size(), 5u);
  EXPECT_EQ(types[4].as_string(), "hash_moe");
  EXPECT_EQ(types[0].as_string(), "moe");
  MoeWeights r = load_moe_layer(md, 4);
  EXPECT_TRUE(r.config.hash_routed);
  EXPECT_EQ(r.router.tid2eid, w.router.tid2eid);
  EXPECT_EQ(r.router.vocab, 10);
  EXPECT_FALSE(read_moe_config(md, 2).hash_routed);
  // Saving over a sharded checkpoint would leave a stale index: refused.
  test::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {}})");
  EXPECT_ERROR_CONTAINS(save_moe_layer(dir.path(), 4, w), "already holds a sharded checkpoint");
}

// A directory holding only a config.json, for read_moe_config.
struct ConfigDir {
  ScratchDir dir;
  explicit ConfigDir(const std::string& config) {
    test::write_text(dir / "config.json", config);
    SafetensorsWriter().write(dir / "model.safetensors");
  }
};

const char* kBaseConfig =
    R"("hidden_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2)";

TEST(ReadMoeConfig, HashLayerRulesOfSpec4) {
  {
    ConfigDir d(std::string("{") + kBaseConfig + "}");  // neither key: 3 hash layers
    ModelDir md(d.dir.path());
    EXPECT_TRUE(read_moe_config(md, 0).hash_routed);
    EXPECT_TRUE(read_moe_config(md, 2).hash_routed);
    EXPECT_FALSE(read_moe_config(md, 3).hash_routed);
    MoeConfig c = read_moe_config(md, 3);
    EXPECT_EQ(c.scoring, Scoring::SqrtSoftplus);
    EXPECT_TRUE(c.norm_topk_prob);
    EXPECT_EQ(c.routed_scaling_factor, 1.0f);
    EXPECT_FALSE(c.swiglu_limit.has_value());
    EXPECT_EQ(c.shared_experts, 0);
  }
  {
    ConfigDir d(std::string("{") + kBaseConfig + R"(, "num_hash_layers": 1, "scoring_func": "sigmoid",
        "norm_topk_prob": false, "swiglu_limit": 10, "routed_scaling_factor": 1.5, "n_shared_experts": 1})");
    ModelDir md(d.dir.path());
    EXPECT_TRUE(read_moe_config(md, 0).hash_routed);
    MoeConfig c = read_moe_config(md, 1);
    EXPECT_FALSE(c.hash_routed);
    EXPECT_EQ(c.scoring, Scoring::Sigmoid);
    EXPECT_FALSE(c.norm_topk_prob);
    EXPECT_EQ(c.swiglu_limit, std::optional<float>(10.0f));
    EXPECT_EQ(c.routed_scaling_factor, 1.5f);
    EXPECT_EQ(c.shared_experts, 1);
  }
  {
    // mlp_layer_types wins over num_hash_layers.
    ConfigDir d(std::string("{") + kBaseConfig +
                R"(, "num_hash_layers": 3, "mlp_layer_types": ["moe", "hash_moe"], "scoring_func": "softmax"})");
    ModelDir md(d.dir.path());
    EXPECT_FALSE(read_moe_config(md, 0).hash_routed);
    EXPECT_TRUE(read_moe_config(md, 1).hash_routed);
    EXPECT_EQ(read_moe_config(md, 0).scoring, Scoring::Softmax);
    EXPECT_ERROR_CONTAINS(read_moe_config(md, 2), "mlp_layer_types", "2 entries", "layer 2");
  }
}

TEST(ReadMoeConfig, BadKeysAreNamed) {
  struct Case {
    std::string config;
    std::vector<const char*> message;
  };
  const Case cases[] = {
      {R"({"moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2})",
       {"config.json", "missing key \"hidden_size\""}},
      {std::string("{") + kBaseConfig + R"(, "scoring_func": "relu"})", {"\"scoring_func\" is \"relu\""}},
      {R"({"hidden_size": "64", "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2})",
       {"key \"hidden_size\"", "got string"}},
      {std::string("{") + kBaseConfig + R"(, "norm_topk_prob": 1})", {"key \"norm_topk_prob\"", "bool"}},
      {R"({"hidden_size": 60, "moe_intermediate_size": 32, "n_routed_experts": 8, "num_experts_per_tok": 2})",
       {"hidden H must be a positive multiple of 16, got 60"}},
      {"{\"hidden_size\": ", {"config.json", "invalid JSON"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.config);
    ConfigDir d(c.config);
    bool thrown = false;
    try {
      read_moe_config(ModelDir(d.dir.path()), 3);
    } catch (const Error& e) {
      thrown = true;
      for (const char* want : c.message)
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << " lacks " << want;
    }
    EXPECT_TRUE(thrown);
  }
}

// Rewrites model.safetensors of `dir` with tensor `name` replaced (or removed
// when `bytes` is empty).
void replace_tensor(const std::string& dir, const std::string& name, DType dtype, std::vector<int64_t> shape,
                    std::vector<uint8_t> bytes) {
  ModelDir md(dir);
  SafetensorsWriter st;
  for (const auto& n : md.tensor_names()) {
    const TensorInfo& t = md.get(n);
    if (n == name) continue;
    st.add_owned(n, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  if (!bytes.empty()) st.add_owned(name, dtype, shape, std::move(bytes));
  st.write(dir + "/model.safetensors");
}

std::vector<uint8_t> f32(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

TEST(MoeLayerIo, BadCheckpointsNameTensorAndValues) {
  test::Rng rng(11);
  const MoeWeights w = random_weights(tiny_config(), rng, false);
  const std::string e1 = "model.layers.0.mlp.experts.1.";
  struct Case {
    const char* label;
    std::string tensor;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;  // empty: remove the tensor
    std::vector<const char*> message;
  };
  const Case cases[] = {
      {"missing tensor", e1 + "down_proj.weight", DType::U8, {}, {}, {"missing tensor", "experts.1.down_proj.weight\""}},
      {"NaN global scale", e1 + "up_proj.weight_scale_2", DType::F32, {}, f32(NAN), {"experts.1.up_proj.weight_scale_2", "nan"}},
      {"Inf global scale", e1 + "gate_proj.weight_scale_2", DType::F32, {1}, f32(INFINITY), {"gate_proj.weight_scale_2", "inf"}},
      {"zero global scale", e1 + "down_proj.weight_scale_2", DType::F32, {}, f32(0.0f), {"down_proj.weight_scale_2", "is 0"}},
      {"global scale of 2 values", e1 + "down_proj.weight_scale_2", DType::F32, {2}, std::vector<uint8_t>(8, 0x3f),
       {"down_proj.weight_scale_2", "shape [2]", "expected [] or [1]"}},
      {"wrong code shape", e1 + "gate_proj.weight", DType::U8, {16, 8}, std::vector<uint8_t>(128), {"experts.1.gate_proj.weight\"", "shape [16, 8], expected [16, 16]"}},
      {"wrong scale dtype", e1 + "gate_proj.weight_scale", DType::U8, {16, 2}, std::vector<uint8_t>(32, 0x38), {"gate_proj.weight_scale\"", "dtype U8, expected F8_E4M3"}},
      {"NaN block scale", e1 + "up_proj.weight_scale", DType::F8E4M3, {16, 2}, std::vector<uint8_t>(32, 0x7F), {"up_proj.weight_scale\"", "byte 0 (row 0, block 0) is NaN (0x7f)"}},
      {"router wrong shape", "model.layers.0.mlp.gate.weight", DType::F32, {4, 16}, std::vector<uint8_t>(256), {"gate.weight\"", "shape [4, 16], expected [4, 32]"}},
      {"missing shared expert", "model.layers.0.mlp.shared_experts.up_proj.weight", DType::BF16, {}, {}, {"missing tensor", "shared_experts.up_proj.weight"}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.label);
    ScratchDir dir;
    save_moe_layer(dir.path(), 0, w);
    MoeWeights ok = load_moe_layer(ModelDir(dir.path()), 0);  // the saved layer loads
    (void)ok;
    replace_tensor(dir.path(), c.tensor, c.dtype, c.shape, c.bytes);
    bool thrown = false;
    try {
      load_moe_layer(ModelDir(dir.path()), 0);
    } catch (const Error& e) {
      thrown = true;
      for (const char* want : c.message)
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what() << " lacks " << want;
    }
    EXPECT_TRUE(thrown);
  }
  // A layer 0 saved without config: hash layers default to 3, so tid2eid is required.
  ScratchDir dir;
  save_moe_layer(dir.path(), 0, w);
  test::write_text(dir / "config.json",
                   R"({"hidden_size": 32, "moe_intermediate_size": 16, "n_routed_experts": 4, "num_experts_per_tok": 2,
                       "n_shared_experts": 1})");
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(dir.path()), 0), "missing tensor", "gate.tid2eid");
}

TEST(ModelDir, ShardedDirectoryAndIndexChecks) {
  ScratchDir dir;
  const std::vector<float> a = {1, 2}, b = {3};
  SafetensorsWriter s1, s2;
  s1.add("a", DType::F32, {2}, a.data());
  s2.add("b", DType::F32, {1}, b.data());
  s1.write(dir / "model-00001-of-00002.safetensors");
  s2.write(dir / "model-00002-of-00002.safetensors");
  test::write_text(dir / "model.safetensors.index.json",
                   R"({"metadata": {"total_size": 12}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                       "b": "model-00002-of-00002.safetensors"}})");
  test::write_text(dir / "hf_quant_config.json", R"({"quantization": {"quant_algo": "NVFP4"}})");
  ModelDir md(dir.path());
  EXPECT_EQ(md.tensor_names(), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(md.get("b").to_f32(), b);
  EXPECT_EQ(md.quant_algo(), "NVFP4");
  EXPECT_ERROR_CONTAINS(md.get("c"), dir.path(), "missing tensor \"c\"");

  test::write_text(dir / "model.safetensors.index.json",
                   R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
  EXPECT_ERROR_CONTAINS(ModelDir(dir.path()), "tensor \"c\" is listed in shard", "missing from it");
  test::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../evil.safetensors"}})");
  EXPECT_ERROR_CONTAINS(ModelDir(dir.path()), "invalid shard file \"../evil.safetensors\"");
  test::write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "gone.safetensors"}})");
  EXPECT_ERROR_CONTAINS(ModelDir(dir.path()), "gone.safetensors", "cannot open");

  ScratchDir empty;
  EXPECT_ERROR_CONTAINS(ModelDir(empty.path()), "no model.safetensors and no model.safetensors.index.json");
}

TEST(ModelDir, QuantAlgoFromConfigJson) {
  ConfigDir d(std::string("{") + kBaseConfig + R"(, "quantization_config": {"quant_algo": "NVFP4"}})");
  EXPECT_EQ(ModelDir(d.dir.path()).quant_algo(), "NVFP4");
  ConfigDir plain(std::string("{") + kBaseConfig + "}");
  EXPECT_EQ(ModelDir(plain.dir.path()).quant_algo(), "");
}

}  // namespace
}  // namespace nvfp4moe
