#include "checkpoint/model_fixture.hpp"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"
#include "support/moe_test_util.hpp"
#include "support/shared_fp8_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

namespace {

constexpr int64_t kH = 256, kI = 160, kE = 8, kTopK = 2;

// ---- weights ------------------------------------------------------------------

std::vector<float> dense(Rng& rng, int64_t rows, int64_t cols) {
  return random_normal(rng, rows * cols, 1.0f / std::sqrt(float(cols)));
}

void append(std::vector<uint8_t>& dst, const std::vector<uint8_t>& src) { dst.insert(dst.end(), src.begin(), src.end()); }

// NVFP4 experts as ModelOpt's DeepSeek-V4 export makes them: gate and up of an
// expert quantized with one g from the max of their amaxes, down with its own;
// input scales: one for gate and up (fused), another for down.
ExpertWeights nvfp4_experts(Rng& rng) {
  ExpertWeights ex;
  ex.count = kE;
  ex.hidden = kH;
  ex.intermediate = kI;
  for (int64_t e = 0; e < kE; ++e) {
    const std::vector<float> gate = dense(rng, kI, kH), up = dense(rng, kI, kH), down = dense(rng, kH, kI);
    const float g13 = global_scale_for_amax(std::max(abs_max(gate.data(), kI * kH), abs_max(up.data(), kI * kH)));
    for (const auto* w : {&gate, &up}) {
      const Nvfp4Matrix q = quantize_matrix(w->data(), kI, kH, ScaleScope::Static, g13, true);
      append(ex.w13_codes, q.codes);
      append(ex.w13_scales, q.scales);
      ex.w13_global.push_back(g13);
    }
    const Nvfp4Matrix d = quantize_matrix(down.data(), kH, kI, ScaleScope::PerTensor, 1.0f, true);
    append(ex.w2_codes, d.codes);
    append(ex.w2_scales, d.scales);
    ex.w2_global.push_back(d.global_scale[0]);
    ex.w13_input_scale.push_back(rng.uniform(2e-3f, 8e-3f));
    ex.w2_input_scale.push_back(rng.uniform(1e-3f, 4e-3f));
  }
  return ex;
}

MoeWeights layer_weights(const MoeConfig& c, bool hash, Rng& rng) {
  MoeWeights w;
  w.config = c;
  w.config.hash_routed = hash;
  w.experts = nvfp4_experts(rng);
  for (float v : dense(rng, kE, kH)) w.router.gate.push_back(bf16_to_float(bf16_from_float(v)));  // stored BF16
  w.router.bias.assign(size_t(kE), 0.0f);
  if (hash) {
    w.router.vocab = FixtureModel::kVocab;
    for (int64_t t = 0; t < w.router.vocab; ++t) {
      const int32_t a = int32_t(rng.below(kE)), b = int32_t((a + 1 + rng.below(kE - 1)) % kE);  // distinct
      w.router.tid2eid.insert(w.router.tid2eid.end(), {a, b});
    }
  } else {
    w.router.bias = random_uniform(rng, kE, -0.05f, 0.05f);
  }
  w.shared = random_fp8_shared(rng, kH, kI, TileScales::PowersOfTwo);
  return w;
}

FixtureModel::Mxfp4Proj mxfp4_proj(Rng& rng, int64_t N, int64_t K) {
  FixtureModel::Mxfp4Proj p;
  p.codes.resize(size_t(N * K / 2));
  for (auto& b : p.codes) b = uint8_t(rng.next());
  p.scales.resize(size_t(N * K / 32));
  for (auto& s : p.scales) s = uint8_t(118 + rng.below(6));  // 2^-9 .. 2^-4
  return p;
}

// ---- names of the two layouts (docs/checkpoints.md) ----------------------------

struct Scheme {
  bool deepseek;
  std::string ffn(int L) const {
    return deepseek ? "layers." + std::to_string(L) + ".ffn." : "model.layers." + std::to_string(L) + ".mlp.";
  }
  const char* proj(int p) const {  // 0 gate, 1 up, 2 down
    static const char* ds[] = {"w1", "w3", "w2"};
    static const char* hf[] = {"gate_proj", "up_proj", "down_proj"};
    return deepseek ? ds[p] : hf[p];
  }
};

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  int shard;
};

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  return as_bytes(v);
}
std::vector<uint8_t> f32(float v) { return bytes_of(std::vector<float>{v}); }

std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<Bf16> b;
  for (float x : v) b.push_back(bf16_from_float(x));
  return bytes_of(b);
}

void add_nvfp4(std::vector<Entry>& out, const std::string& p, const ExpertWeights& ex, int64_t e, int proj,
               int shard) {
  const int64_t N = proj == 2 ? kH : kI, K = proj == 2 ? kI : kH;
  const uint8_t* codes = proj == 2 ? ex.w2_codes.data() + e * N * K / 2 : ex.w13_codes.data() + (2 * e + proj) * N * K / 2;
  const uint8_t* scales =
      proj == 2 ? ex.w2_scales.data() + e * N * K / 16 : ex.w13_scales.data() + (2 * e + proj) * N * K / 16;
  const float g = proj == 2 ? ex.w2_global[size_t(e)] : ex.w13_global[size_t(2 * e + proj)];
  const float in = proj == 2 ? ex.w2_input_scale[size_t(e)] : ex.w13_input_scale[size_t(e)];
  out.push_back({p + ".weight", DType::U8, {N, K / 2}, std::vector<uint8_t>(codes, codes + N * K / 2), shard});
  out.push_back({p + ".weight_scale", DType::F8E4M3, {N, K / 16}, std::vector<uint8_t>(scales, scales + N * K / 16), shard});
  out.push_back({p + ".weight_scale_2", DType::F32, {}, f32(g), shard});
  out.push_back({p + ".input_scale", DType::F32, {}, f32(in), shard});
}

// The shared expert: E4M3 weights, tile factors as F8_E8M0 `scale` (DeepSeek)
// or F32 `weight_scale_inv` of the same values (Hugging Face).
void add_shared(std::vector<Entry>& out, const Scheme& s, const std::string& ffn, const SharedExpertWeights& w,
                int shard) {
  const std::vector<uint8_t>* q[] = {&w.w1_fp8, &w.w3_fp8, &w.w2_fp8};
  const std::vector<float>* sc[] = {&w.w1_scale, &w.w3_scale, &w.w2_scale};
  for (int p = 0; p < 3; ++p) {
    const std::string prefix = ffn + "shared_experts." + s.proj(p);
    const int64_t N = p == 2 ? kH : kI, K = p == 2 ? kI : kH;
    out.push_back({prefix + ".weight", DType::F8E4M3, {N, K}, *q[p], shard});
    const std::vector<int64_t> tiles = {(N + 127) / 128, (K + 127) / 128};
    if (s.deepseek) {
      std::vector<uint8_t> e8m0;
      for (float v : *sc[p]) e8m0.push_back(uint8_t(std::ilogb(v) + 127));  // v is a power of two
      out.push_back({prefix + ".scale", DType::F8E8M0, tiles, e8m0, shard});
    } else {
      out.push_back({prefix + ".weight_scale_inv", DType::F32, tiles, bytes_of(*sc[p]), shard});
    }
  }
}

void add_router(std::vector<Entry>& out, const Scheme& s, const std::string& ffn, const MoeWeights& w, int shard) {
  out.push_back({ffn + "gate.weight", DType::BF16, {kE, kH}, bf16_bytes(w.router.gate), shard});
  if (w.config.hash_routed)
    out.push_back({ffn + "gate.tid2eid", DType::I32, {w.router.vocab, kTopK}, bytes_of(w.router.tid2eid), shard});
  else
    out.push_back({ffn + (s.deepseek ? "gate.bias" : "gate.e_score_correction_bias"), DType::F32, {kE},
                   bytes_of(w.router.bias), shard});
}

// A main layer; `split` moves experts from `split` on, the router and the shared expert to shard + 1.
void add_layer(std::vector<Entry>& out, const Scheme& s, int L, const MoeWeights& w, int shard, int64_t split) {
  const std::string ffn = s.ffn(L);
  for (int64_t e = 0; e < kE; ++e)
    for (int p = 0; p < 3; ++p)
      add_nvfp4(out, ffn + "experts." + std::to_string(e) + "." + s.proj(p), w.experts, e, p, e < split ? shard : shard + 1);
  const int rest = split < kE ? shard + 1 : shard;
  add_router(out, s, ffn, w, rest);
  add_shared(out, s, ffn, w.shared, rest);
  // Attention and norms of the layer: present in real checkpoints, ignored by the MoE loader.
  const std::string blk = s.deepseek ? "layers." + std::to_string(L) + "." : "model.layers." + std::to_string(L) + ".";
  out.push_back({blk + (s.deepseek ? "attn.wq_a.weight" : "self_attn.q_a_proj.weight"), DType::F8E4M3, {128, kH},
                 std::vector<uint8_t>(size_t(128 * kH), 0x38), shard});
  out.push_back({blk + (s.deepseek ? "attn.wq_a.scale" : "self_attn.q_a_proj.weight_scale_inv"),
                 s.deepseek ? DType::F8E8M0 : DType::F32, {1, 2},
                 s.deepseek ? std::vector<uint8_t>{127, 127} : bytes_of(std::vector<float>{1.0f, 1.0f}), shard});
  out.push_back({blk + (s.deepseek ? "ffn_norm.weight" : "post_attention_layernorm.weight"), DType::BF16, {kH},
                 bf16_bytes(std::vector<float>(size_t(kH), 1.0f)), shard});
}

void add_mtp(std::vector<Entry>& out, const FixtureModel& m, int shard) {
  const Scheme s{true};
  const std::string ffn = "mtp.0.ffn.";
  for (int64_t e = 0; e < kE; ++e)
    for (int p = 0; p < 3; ++p) {
      const int64_t N = p == 2 ? kH : kI, K = p == 2 ? kI : kH;
      const std::string prefix = ffn + "experts." + std::to_string(e) + "." + s.proj(p);
      out.push_back({prefix + ".weight", DType::I8, {N, K / 2}, m.mtp_experts[size_t(e)][size_t(p)].codes, shard});
      out.push_back({prefix + ".scale", DType::F8E8M0, {N, K / 32}, m.mtp_experts[size_t(e)][size_t(p)].scales, shard});
    }
  add_router(out, s, ffn, m.mtp, shard);
  add_shared(out, s, ffn, m.mtp.shared, shard);
  out.push_back({"mtp.0.e_proj.weight", DType::F8E4M3, {kH, kH}, std::vector<uint8_t>(size_t(kH * kH), 0x30), shard});
  out.push_back({"mtp.0.e_proj.scale", DType::F8E8M0, {2, 2}, {126, 126, 126, 126}, shard});
}

// ---- files ----------------------------------------------------------------------

void write_shards(const std::vector<Entry>& entries, int shards, const std::string& dir) {
  std::filesystem::create_directories(dir);
  json::Value map = json::Value::object();
  int64_t total = 0;
  for (int k = 0; k < shards; ++k) {
    char name[64];
    std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", k + 1, shards);
    SafetensorsWriter w;
    for (const Entry& e : entries) {
      if (e.shard != k) continue;
      w.add(e.name, e.dtype, e.shape, e.bytes.data());
      map.set(e.name, json::Value::string(name));
      total += int64_t(e.bytes.size());
    }
    w.set_metadata("format", "pt");
    w.write(dir + "/" + name);
  }
  json::Value index = json::Value::object({{"metadata", json::Value::object({{"total_size", json::Value::integer(total)}})},
                                           {"weight_map", std::move(map)}});
  write_text(dir + "/model.safetensors.index.json", json::dump(index, 2));
}

json::Value moe_keys(const MoeConfig& c) {
  using json::Value;
  return Value::object({{"architectures", Value::array({Value::string("DeepseekV4ForCausalLM")})},
                        {"model_type", Value::string("deepseek_v4")},
                        {"hidden_size", Value::integer(c.hidden)},
                        {"moe_intermediate_size", Value::integer(c.intermediate)},
                        {"n_routed_experts", Value::integer(c.experts)},
                        {"num_experts_per_tok", Value::integer(c.top_k)},
                        {"n_shared_experts", Value::integer(c.shared_experts)},
                        {"num_hidden_layers", Value::integer(FixtureModel::kLayers)},
                        {"routed_scaling_factor", Value::number(c.routed_scaling_factor)},
                        {"scoring_func", Value::string("sqrtsoftplus")},
                        {"swiglu_limit", Value::number(*c.swiglu_limit)},
                        {"norm_topk_prob", Value::boolean(true)},
                        {"vocab_size", Value::integer(FixtureModel::kVocab)}});
}

json::Value string_array(std::initializer_list<const char*> items) {
  json::Value a = json::Value::array();
  for (const char* s : items) a.push(json::Value::string(s));
  return a;
}

// config.json as the official release has it (plus ModelOpt's quantization_config),
// DeepSeek's inference/config.json, and ModelOpt's MIXED_PRECISION hf_quant_config.json.
void write_deepseek_configs(const FixtureModel& m, const std::string& dir) {
  using json::Value;
  Value layers = Value::object();
  for (int L = 0; L < FixtureModel::kLayers; ++L)
    layers.set("layers." + std::to_string(L) + ".ffn.experts",
               Value::object({{"quant_algo", Value::string("NVFP4")}, {"group_size", Value::integer(16)}}));
  const Value excluded = string_array({"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"});
  Value c = moe_keys(m.config);
  c.set("num_hash_layers", Value::integer(FixtureModel::kHashLayers));
  c.set("num_nextn_predict_layers", Value::integer(1));
  c.set("topk_method", Value::string("noaux_tc"));
  c.set("expert_dtype", Value::string("fp4"));
  c.set("quantization_config",
        Value::object({{"activation_scheme", Value::string("dynamic")}, {"fmt", Value::string("e4m3")},
                       {"quant_method", Value::string("fp8")}, {"scale_fmt", Value::string("ue8m0")},
                       {"weight_block_size", Value::array({Value::integer(128), Value::integer(128)})},
                       {"moe_quant_algo", Value::string("NVFP4")}, {"quant_algo", Value::string("MIXED_PRECISION")},
                       {"group_size", Value::integer(16)}, {"quantized_layers", layers}, {"ignore", excluded}}));
  write_text(dir + "/config.json", json::dump(c, 2));
  const MoeConfig& k = m.config;
  Value inf = Value::object({{"dim", Value::integer(k.hidden)}, {"moe_inter_dim", Value::integer(k.intermediate)},
                             {"n_routed_experts", Value::integer(k.experts)},
                             {"n_activated_experts", Value::integer(k.top_k)},
                             {"n_shared_experts", Value::integer(k.shared_experts)},
                             {"n_layers", Value::integer(FixtureModel::kLayers)},
                             {"n_hash_layers", Value::integer(FixtureModel::kHashLayers)},
                             {"n_mtp_layers", Value::integer(1)}, {"score_func", Value::string("sqrtsoftplus")},
                             {"route_scale", Value::number(k.routed_scaling_factor)},
                             {"swiglu_limit", Value::number(*k.swiglu_limit)}, {"expert_dtype", Value::string("fp4")},
                             {"vocab_size", Value::integer(FixtureModel::kVocab)}});
  std::filesystem::create_directories(dir + "/inference");
  write_text(dir + "/inference/config.json", json::dump(inf, 2));
  Value hq = Value::object(
      {{"producer", Value::object({{"name", Value::string("modelopt")}, {"version", Value::string("dsv4-nvfp4-experts")}})},
       {"quantization", Value::object({{"quant_algo", Value::string("MIXED_PRECISION")}, {"kv_cache_quant_algo", Value()},
                                       {"group_size", Value::integer(16)}, {"quantized_layers", layers},
                                       {"exclude_modules", excluded}})}});
  write_text(dir + "/hf_quant_config.json", json::dump(hq, 2));
}

}  // namespace

FixtureModel make_fixture_model(uint64_t seed) {
  Rng rng(seed);
  FixtureModel m;
  const MoeConfig& c = m.config = small_config(kH, kI, kE, kTopK);  // one shared expert, rho 1.5, limit 10
  for (int L = 0; L < FixtureModel::kLayers; ++L) m.layers.push_back(layer_weights(c, L < FixtureModel::kHashLayers, rng));
  m.mtp = layer_weights(c, false, rng);
  m.mtp.experts = ExpertWeights{};
  for (int64_t e = 0; e < kE; ++e) m.mtp_experts.push_back({mxfp4_proj(rng, kI, kH), mxfp4_proj(rng, kI, kH), mxfp4_proj(rng, kH, kI)});
  return m;
}

void write_deepseek_layout(const FixtureModel& m, const std::string& dir) {
  const Scheme s{true};
  std::vector<Entry> e;
  e.push_back({"embed.weight", DType::BF16, {FixtureModel::kVocab, kH}, bf16_bytes(std::vector<float>(size_t(FixtureModel::kVocab * kH), 0.5f)), 0});
  add_layer(e, s, 0, m.layers[0], 0, kE);
  add_layer(e, s, 1, m.layers[1], 0, 4);  // experts 4..7, router and shared expert in the next shard
  add_layer(e, s, 2, m.layers[2], 1, kE);
  add_mtp(e, m, 2);
  e.push_back({"head.weight", DType::BF16, {FixtureModel::kVocab, kH}, bf16_bytes(std::vector<float>(size_t(FixtureModel::kVocab * kH), 0.25f)), 2});
  write_shards(e, 3, dir);
  write_deepseek_configs(m, dir);
}

void write_huggingface_layout(const FixtureModel& m, const std::string& dir) {
  const Scheme s{false};
  std::vector<Entry> e;
  e.push_back({"model.embed_tokens.weight", DType::BF16, {FixtureModel::kVocab, kH}, bf16_bytes(std::vector<float>(size_t(FixtureModel::kVocab * kH), 0.5f)), 0});
  for (int L = 0; L < FixtureModel::kLayers; ++L) add_layer(e, s, L, m.layers[size_t(L)], L < 2 ? 0 : 1, kE);
  write_shards(e, 2, dir);
  using json::Value;
  Value c = moe_keys(m.config);
  c.set("mlp_layer_types", string_array({"hash_moe", "moe", "moe"}));
  c.set("num_nextn_predict_layers", Value::integer(1));
  c.set("quantization_config", Value::object({{"quant_method", Value::string("modelopt")},
                                              {"quant_algo", Value::string("NVFP4")}, {"group_size", Value::integer(16)}}));
  write_text(dir + "/config.json", json::dump(c, 2));
  write_text(dir + "/hf_quant_config.json",
             R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                 "exclude_modules": ["model.layers.*.self_attn*", "model.layers.*.mlp.shared_experts*", "lm_head"]}})");
}

void replace_in_model(const std::string& dir, const std::string& name, DType dtype, std::vector<int64_t> shape,
                      std::vector<uint8_t> bytes) {
  const std::string index_path = dir + "/model.safetensors.index.json";
  const bool sharded = std::filesystem::exists(index_path), keep = !bytes.empty();
  json::Value index;
  std::string shard = "model.safetensors";
  if (sharded) {
    const std::vector<uint8_t> text = read_bytes(index_path);
    index = json::parse(std::string(text.begin(), text.end()));
    // A new tensor goes next to its weight ("<prefix>.weight").
    const json::Value* map = index.find("weight_map");
    const json::Value* at = map->find(name) ? map->find(name) : map->find(name.substr(0, name.rfind('.')) + ".weight");
    NVFP4_CHECK(at, "replace_in_model: no shard for ", name);
    shard = at->as_string();
  }
  SafetensorsWriter w;
  {
    SafetensorsFile f(dir + "/" + shard);
    for (const TensorInfo& t : f.tensors())
      if (t.name != name) w.add_owned(t.name, t.dtype, t.shape, std::vector<uint8_t>(t.data, t.data + t.nbytes));
  }
  if (keep) w.add_owned(name, dtype, std::move(shape), std::move(bytes));
  w.write(dir + "/" + shard);
  if (!sharded) return;
  json::Value map = json::Value::object();
  for (const auto& [k, v] : index.find("weight_map")->members())
    if (k != name) map.set(k, v);
  if (keep) map.set(name, json::Value::string(shard));
  index.set("weight_map", std::move(map));
  write_text(index_path, json::dump(index, 2));
}

// Every field of a loaded layer against the weights the fixture wrote.
void expect_same_layer(const MoeWeights& got, const MoeWeights& want) {
  const MoeConfig &g = got.config, &w = want.config;
  EXPECT_EQ(g.hidden, w.hidden);
  EXPECT_EQ(g.intermediate, w.intermediate);
  EXPECT_EQ(g.experts, w.experts);
  EXPECT_EQ(g.top_k, w.top_k);
  EXPECT_EQ(g.shared_experts, 1);
  EXPECT_EQ(g.shared_inter(), w.intermediate);
  EXPECT_EQ(g.routed_scaling_factor, 1.5f);
  EXPECT_EQ(g.swiglu_limit, std::optional<float>(10.0f));
  EXPECT_EQ(g.scoring, Scoring::SqrtSoftplus);
  EXPECT_EQ(g.hash_routed, w.hash_routed);
  const ExpertWeights &a = got.experts, &b = want.experts;
  EXPECT_EQ(a.count, b.count);
  EXPECT_TRUE(a.w13_codes == b.w13_codes) << "w13_codes";
  EXPECT_TRUE(a.w13_scales == b.w13_scales) << "w13_scales";
  EXPECT_TRUE(a.w2_codes == b.w2_codes) << "w2_codes";
  EXPECT_TRUE(a.w2_scales == b.w2_scales) << "w2_scales";
  EXPECT_EQ(a.w13_global, b.w13_global);
  EXPECT_EQ(a.w2_global, b.w2_global);
  EXPECT_EQ(a.w13_input_scale, b.w13_input_scale);
  EXPECT_EQ(a.w2_input_scale, b.w2_input_scale);
  EXPECT_TRUE(got.router.gate == want.router.gate) << "router gate";
  EXPECT_EQ(got.router.bias, want.router.bias);
  EXPECT_EQ(got.router.tid2eid, want.router.tid2eid);
  EXPECT_EQ(got.router.vocab, want.router.vocab);
  const SharedExpertWeights &s = got.shared, &t = want.shared;
  ASSERT_EQ(s.format, SharedExpertFormat::Fp8Block);
  EXPECT_TRUE(s.w1_fp8 == t.w1_fp8 && s.w3_fp8 == t.w3_fp8 && s.w2_fp8 == t.w2_fp8) << "shared FP8 weights";
  EXPECT_EQ(s.w1_scale, t.w1_scale);
  EXPECT_EQ(s.w3_scale, t.w3_scale);
  EXPECT_EQ(s.w2_scale, t.w2_scale);
}

RunInput write_run_input(uint64_t seed, int64_t T, int64_t H, const std::string& path) {
  Rng rng(seed);
  RunInput in{random_normal(rng, T * H), {}};
  for (int64_t t = 0; t < T; ++t) in.tokens.push_back(int32_t(rng.below(FixtureModel::kVocab)));
  SafetensorsWriter w;
  w.add("hidden_states", DType::F32, {T, H}, in.x.data());
  w.add("token_ids", DType::I32, {T}, in.tokens.data());
  w.write(path);
  return in;
}

ToolRun run_tool(const std::string& args) {
  ScratchDir d;
  const std::string err = d / "stderr";
  ToolRun r;
  FILE* p = ::popen((std::string(NVFP4MOE_CLI_PATH) + " " + args + " 2>" + err).c_str(), "r");
  if (!p) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  const std::vector<uint8_t> e = read_bytes(err);
  r.err.assign(e.begin(), e.end());
  return r;
}

}  // namespace nvfp4moe::test
