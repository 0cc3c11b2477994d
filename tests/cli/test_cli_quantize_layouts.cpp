// `nvfp4moe quantize` keeps the layout it reads: DeepSeek-named BF16 experts
// (layers.L.ffn.experts.E.w1|w2|w3) are quantized by default and keep their
// names, with ModelOpt's MIXED_PRECISION manifest; Hugging Face names keep
// theirs with the plain NVFP4 one. In both, an expert's gate and up share one
// weight_scale_2 from the larger amax (also across shards), down keeps its
// own, and the manifests carry what vLLM's ModelOpt loader requires.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

std::string text_of(const std::string& path) {
  const std::vector<uint8_t> b = test::read_bytes(path);
  return std::string(b.begin(), b.end());
}

std::string q(const std::string& p) { return "'" + p + "'"; }

struct Bf16Tensor {
  std::vector<Bf16> v;
  int64_t rows = 0, cols = 0;
  float amax() const {
    float m = 0;
    for (Bf16 x : v) m = std::max(m, std::fabs(bf16_to_float(x)));
    return m;
  }
};

Bf16Tensor random_bf16(test::Rng& rng, int64_t rows, int64_t cols, float scale) {
  Bf16Tensor t{{}, rows, cols};
  for (float x : test::random_normal(rng, rows * cols, scale)) t.v.push_back(bf16_from_float(x));
  return t;
}

float scalar(const ModelDir& d, const std::string& name) {
  const TensorInfo& t = d.get(name);
  EXPECT_EQ(t.dtype, DType::F32) << name;
  EXPECT_TRUE(t.shape.empty()) << name << ": weight_scale_2 is written 0-d";
  float v;
  std::memcpy(&v, t.data, 4);
  return v;
}

// The triple under `prefix` holds exactly the bytes of `want` (a quantize_matrix result).
void expect_triple(const ModelDir& d, const std::string& prefix, const Nvfp4Matrix& want, float g) {
  SCOPED_TRACE(prefix);
  const TensorInfo& c = d.get(prefix + ".weight");
  const TensorInfo& s = d.get(prefix + ".weight_scale");
  EXPECT_EQ(c.dtype, DType::U8);
  EXPECT_EQ(s.dtype, DType::F8E4M3);
  ASSERT_EQ(c.nbytes, want.codes.size());
  ASSERT_EQ(s.nbytes, want.scales.size());
  EXPECT_BYTES_EQ(c.data, want.codes.data(), int64_t(c.nbytes), "codes");
  EXPECT_BYTES_EQ(s.data, want.scales.data(), int64_t(s.nbytes), "block scales");
  EXPECT_EQ(scalar(d, prefix + ".weight_scale_2"), g);
}

Nvfp4Matrix with_g(const Bf16Tensor& t, float g) {
  return quantize_matrix(t.v.data(), t.rows, t.cols, ScaleScope::Static, g);
}
Nvfp4Matrix own_g(const Bf16Tensor& t) { return quantize_matrix(t.v.data(), t.rows, t.cols, ScaleScope::PerTensor); }

std::vector<std::string> strings(const json::Value& a) {
  std::vector<std::string> r;
  for (const auto& x : a.items()) r.push_back(x.as_string());
  std::sort(r.begin(), r.end());
  return r;
}

TEST(CliQuantizeLayouts, DeepSeekNamesAreQuantizedAndKeptWithSharedW13Scales) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const int64_t H = 64, I = 32;
  const std::string ffn = "layers.0.ffn.";
  // Expert 0's w1 and w3 lie in different shards; w3's amax is the larger.
  const Bf16Tensor e0w1 = random_bf16(rng, I, H, 1.0f), e0w3 = random_bf16(rng, I, H, 3.0f),
                   e0w2 = random_bf16(rng, H, I, 1.0f);
  // Expert 1 in one shard; w1's amax is the larger.
  const Bf16Tensor e1w1 = random_bf16(rng, I, H, 5.0f), e1w3 = random_bf16(rng, I, H, 0.5f);
  const Bf16Tensor shared = random_bf16(rng, I, H, 1.0f), attn = random_bf16(rng, H, H, 1.0f),
                   mtp = random_bf16(rng, I, H, 1.0f);
  ScratchDir in, out_parent;
  SafetensorsWriter s1, s2;
  s1.add(ffn + "experts.0.w1.weight", DType::BF16, {I, H}, e0w1.v.data());
  s1.add(ffn + "experts.0.w2.weight", DType::BF16, {H, I}, e0w2.v.data());
  s1.add(ffn + "experts.1.w1.weight", DType::BF16, {I, H}, e1w1.v.data());
  s1.add(ffn + "experts.1.w3.weight", DType::BF16, {I, H}, e1w3.v.data());
  s1.add("layers.0.attn.wq.weight", DType::BF16, {H, H}, attn.v.data());
  s2.add(ffn + "experts.0.w3.weight", DType::BF16, {I, H}, e0w3.v.data());
  s2.add(ffn + "shared_experts.w1.weight", DType::BF16, {I, H}, shared.v.data());
  s2.add("mtp.0.ffn.experts.0.w1.weight", DType::BF16, {I, H}, mtp.v.data());
  s1.write(in / "model-00001-of-00002.safetensors");
  s2.write(in / "model-00002-of-00002.safetensors");
  json::Value map = json::Value::object();
  for (const char* n : {"experts.0.w1.weight", "experts.0.w2.weight", "experts.1.w1.weight", "experts.1.w3.weight"})
    map.set(ffn + n, json::Value::string("model-00001-of-00002.safetensors"));
  map.set("layers.0.attn.wq.weight", json::Value::string("model-00001-of-00002.safetensors"));
  for (const std::string& n : {ffn + "experts.0.w3.weight", ffn + "shared_experts.w1.weight",
                              std::string("mtp.0.ffn.experts.0.w1.weight")})
    map.set(n, json::Value::string("model-00002-of-00002.safetensors"));
  test::write_text(in / "model.safetensors.index.json",
                   json::dump(json::Value::object({{"metadata", json::Value::object()}, {"weight_map", map}})));
  test::write_text(in / "config.json", R"({"hidden_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 2,
                                          "num_experts_per_tok": 1, "num_hash_layers": 0, "swiglu_limit": 10.0})");

  const std::string out = out_parent / "q";
  const test::ToolRun r = test::run_tool("quantize --in " + q(in.path()) + " --out " + q(out));
  ASSERT_EQ(r.code, 0) << r.err;
  const ModelDir d(out);
  EXPECT_EQ(d.layout(), CheckpointLayout::DeepSeek);
  EXPECT_FALSE(d.has("model.layers.0.mlp.experts.0.gate_proj.weight"));

  const float g0 = global_scale_for_amax(std::max(e0w1.amax(), e0w3.amax()));
  ASSERT_EQ(g0, own_g(e0w3).global_scale[0]);
  expect_triple(d, ffn + "experts.0.w3", own_g(e0w3), g0);  // the larger amax: its own g
  expect_triple(d, ffn + "experts.0.w1", with_g(e0w1, g0), g0);
  EXPECT_NE(own_g(e0w1).global_scale[0], g0) << "the pairing is not tested by this seed";
  expect_triple(d, ffn + "experts.0.w2", own_g(e0w2), own_g(e0w2).global_scale[0]);  // down: its own
  const float g1 = own_g(e1w1).global_scale[0];
  expect_triple(d, ffn + "experts.1.w1", own_g(e1w1), g1);
  expect_triple(d, ffn + "experts.1.w3", with_g(e1w3, g1), g1);
  for (const std::string& n : {ffn + "shared_experts.w1.weight", std::string("layers.0.attn.wq.weight"),
                              std::string("mtp.0.ffn.experts.0.w1.weight")})
    EXPECT_EQ(d.get(n).dtype, DType::BF16) << n << " is not a main layer's routed expert";

  const std::vector<std::string> excluded = {"layers.0.attn.wq", "layers.0.ffn.shared_experts.w1",
                                             "mtp.0.ffn.experts.0.w1"};
  const json::Value hq = json::parse(text_of(out + "/hf_quant_config.json"));
  const json::Value* m = hq.find("quantization");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->find("quant_algo")->as_string(), "MIXED_PRECISION");
  ASSERT_NE(m->find("kv_cache_quant_algo"), nullptr);
  EXPECT_TRUE(m->find("kv_cache_quant_algo")->is_null());
  EXPECT_EQ(m->find("group_size")->as_int(), 16);
  ASSERT_EQ(m->find("quantized_layers")->members().size(), 1u);
  EXPECT_EQ(m->find("quantized_layers")->find("layers.0.ffn.experts")->find("quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(strings(*m->find("exclude_modules")), excluded);
  const json::Value cfg = json::parse(text_of(out + "/config.json"));
  const json::Value* qc = cfg.find("quantization_config");
  ASSERT_NE(qc, nullptr);
  EXPECT_EQ(qc->find("quant_method")->as_string(), "modelopt");
  EXPECT_EQ(qc->find("moe_quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(qc->find("quant_algo")->as_string(), "MIXED_PRECISION");
  EXPECT_EQ(qc->find("quantized_layers")->find("layers.0.ffn.experts")->find("group_size")->as_int(), 16);
  EXPECT_EQ(strings(*qc->find("ignore")), excluded);
  EXPECT_EQ(d.quant_manifest().algo_of("layers.0.ffn.experts"), "NVFP4");
  EXPECT_EQ(d.quant_manifest().algo_of("mtp.0.ffn.experts"), "");

  // A single DeepSeek-named file: the same default pattern and pairing.
  SafetensorsWriter one;
  one.add(ffn + "experts.1.w1.weight", DType::BF16, {I, H}, e1w1.v.data());
  one.add(ffn + "experts.1.w3.weight", DType::BF16, {I, H}, e1w3.v.data());
  one.write(in / "one.safetensors");
  const test::ToolRun r1 =
      test::run_tool("quantize --in " + q(in / "one.safetensors") + " --out " + q(out_parent / "one.safetensors"));
  ASSERT_EQ(r1.code, 0) << r1.err;
  const ModelDir f(out_parent / "one.safetensors");
  expect_triple(f, ffn + "experts.1.w3", with_g(e1w3, g1), g1);
}

TEST(CliQuantizeLayouts, HuggingFaceGateAndUpShareTheirScaleAndTheManifestsSuitVllm) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const int64_t H = 64, I = 32;
  const std::string e = "model.layers.0.mlp.experts.0.";
  const Bf16Tensor gate = random_bf16(rng, I, H, 4.0f), up = random_bf16(rng, I, H, 1.0f),
                   down = random_bf16(rng, H, I, 1.0f), router = random_bf16(rng, 2, H, 1.0f),
                   attn = random_bf16(rng, H, H, 1.0f);
  ScratchDir in, out_parent;
  SafetensorsWriter w;
  w.add(e + "gate_proj.weight", DType::BF16, {I, H}, gate.v.data());
  w.add(e + "up_proj.weight", DType::BF16, {I, H}, up.v.data());
  w.add(e + "down_proj.weight", DType::BF16, {H, I}, down.v.data());
  w.add("model.layers.0.mlp.gate.weight", DType::BF16, {2, H}, router.v.data());
  w.add("model.layers.0.self_attn.q_proj.weight", DType::BF16, {H, H}, attn.v.data());
  w.write(in / "model.safetensors");
  test::write_text(in / "config.json", R"({"hidden_size": 64, "moe_intermediate_size": 32, "n_routed_experts": 1,
                                          "num_experts_per_tok": 1, "mlp_layer_types": ["moe"]})");
  const std::string out = out_parent / "q";
  const test::ToolRun r = test::run_tool("quantize --in " + q(in.path()) + " --out " + q(out));
  ASSERT_EQ(r.code, 0) << r.err;
  const ModelDir d(out);
  EXPECT_EQ(d.layout(), CheckpointLayout::HuggingFace);
  const float g = own_g(gate).global_scale[0];
  EXPECT_EQ(g, global_scale_for_amax(std::max(gate.amax(), up.amax())));
  expect_triple(d, e + "gate_proj", own_g(gate), g);
  expect_triple(d, e + "up_proj", with_g(up, g), g);
  EXPECT_NE(own_g(up).global_scale[0], g) << "the pairing is not tested by this seed";
  expect_triple(d, e + "down_proj", own_g(down), own_g(down).global_scale[0]);

  const std::vector<std::string> excluded = {"model.layers.0.mlp.gate", "model.layers.0.self_attn.q_proj"};
  // hf_quant_config.json: vLLM's ModelOptNvFp4Config requires group_size,
  // kv_cache_quant_algo (null: no KV-cache quantization) and exclude_modules.
  const json::Value hq = json::parse(text_of(out + "/hf_quant_config.json"));
  const json::Value* m = hq.find("quantization");
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->find("quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(m->find("group_size")->as_int(), 16);
  ASSERT_NE(m->find("kv_cache_quant_algo"), nullptr);
  EXPECT_TRUE(m->find("kv_cache_quant_algo")->is_null());
  EXPECT_EQ(strings(*m->find("exclude_modules")), excluded);
  // config.json (which vLLM reads first): the exclusions as "ignore", and a
  // weights-only config group, since the files hold no input_scale.
  const json::Value cfg = json::parse(text_of(out + "/config.json"));
  const json::Value* qc = cfg.find("quantization_config");
  ASSERT_NE(qc, nullptr);
  EXPECT_EQ(qc->find("quant_method")->as_string(), "modelopt");
  EXPECT_EQ(qc->find("quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(strings(*qc->find("ignore")), excluded);
  const json::Value* g0 = qc->find("config_groups")->find("group_0");
  ASSERT_NE(g0, nullptr);
  EXPECT_EQ(g0->find("weights")->find("num_bits")->as_int(), 4);
  EXPECT_EQ(g0->find("weights")->find("group_size")->as_int(), 16);
  EXPECT_EQ(g0->find("weights")->find("type")->as_string(), "float");
  EXPECT_EQ(g0->find("input_activations"), nullptr);
  EXPECT_EQ(d.quant_algo(), "NVFP4");
}

}  // namespace
}  // namespace nvfp4moe
