// The MoE config of one layer, read from a model config in either spelling
// (transformers' keys, or DeepSeek's inference/config.json keys), and written
// for either checkpoint layout. Key names and their sources:
// docs/checkpoints.md.
#include <cmath>

#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

// Bounds of the geometry read from a config: far above any published model
// (DeepSeek-V4-Pro: H = 7168, I = 3072, E = 384, k = 6), and small enough
// that the products the loader forms (E * 2I * H bytes) stay within int64.
constexpr int64_t kMaxWidth = int64_t(1) << 20;    // hidden_size, moe_intermediate_size
constexpr int64_t kMaxExperts = int64_t(1) << 16;  // n_routed_experts, num_experts_per_tok
constexpr int64_t kMaxLayers = int64_t(1) << 20;   // num_hash_layers

// A config value under its Hugging Face key or DeepSeek's inference key.
class ConfigKeys {
 public:
  ConfigKeys(const json::Value& c, std::string src) : c_(c), src_(std::move(src)) {}
  const std::string& src() const { return src_; }

  // The value (nullptr when absent or null); both keys with different values is an error.
  const json::Value* find(const char* hf, const char* ds = nullptr) const {
    const json::Value* a = present(hf);
    const json::Value* b = ds ? present(ds) : nullptr;
    if (a && b) {
      const bool same = a->is_number() && b->is_number() ? a->as_double() == b->as_double()
                                                         : json::dump(*a) == json::dump(*b);
      NVFP4_CHECK(same, src_, ": keys \"", hf, "\" (", json::dump(*a), ") and \"", ds, "\" (", json::dump(*b),
                  ") disagree");
    }
    return a ? a : b;
  }
  std::string what(const char* hf, const char* ds) const {
    return src_ + ": key \"" + (present(hf) || !ds ? hf : ds) + "\"";
  }
  // An integer in [lo, hi]; out of range is an error naming the key.
  int64_t integer(const char* hf, const char* ds, std::optional<int64_t> fallback, int64_t lo, int64_t hi) const {
    const json::Value* v = find(hf, ds);
    if (!v) {
      NVFP4_CHECK(fallback.has_value(), src_, ": missing key \"", hf, "\"", ds ? " (or \"" : "", ds ? ds : "",
                  ds ? "\")" : "");
      return *fallback;
    }
    const int64_t x = v->as_int(what(hf, ds));
    NVFP4_CHECK(x >= lo && x <= hi, what(hf, ds), " is ", x, ", out of range [", lo, ", ", hi, "]");
    return x;
  }
  double number(const char* hf, const char* ds, double fallback) const {
    const json::Value* v = find(hf, ds);
    return v ? v->as_double(what(hf, ds)) : fallback;
  }

 private:
  const json::Value* present(const char* key) const {
    const json::Value* v = c_.find(key);
    return v && !v->is_null() ? v : nullptr;
  }
  const json::Value& c_;
  std::string src_;
};

Scoring parse_scoring(const std::string& f, const std::string& what) {
  if (f == "sqrtsoftplus") return Scoring::SqrtSoftplus;
  if (f == "sigmoid") return Scoring::Sigmoid;
  if (f == "softmax") return Scoring::Softmax;
  NVFP4_FAIL(what, " is \"", f, "\" (expected sqrtsoftplus, sigmoid or softmax)");
}

// Main layer `layer`: mlp_layer_types[layer] == "hash_moe", else layer <
// num_hash_layers | n_hash_layers; when both are absent, 3 (transformers'
// DeepSeek-V4 default) or `absent_hash_layers`.
bool layer_is_hash_routed(const ConfigKeys& k, const json::Value& c, int layer, int64_t absent_hash_layers) {
  if (const json::Value* types = c.find("mlp_layer_types"); types && !types->is_null()) {
    const auto& t = types->items(k.src() + ": key \"mlp_layer_types\"");
    NVFP4_CHECK(layer >= 0 && size_t(layer) < t.size(), k.src(), ": key \"mlp_layer_types\" has ", t.size(),
                " entries, no entry for layer ", layer);
    return t[size_t(layer)].as_string(k.src() + ": mlp_layer_types[" + std::to_string(layer) + "]") == "hash_moe";
  }
  return layer < k.integer("num_hash_layers", "n_hash_layers", absent_hash_layers, 0, kMaxLayers);
}

// DeepSeek-V4.1's config.json: model_type "deepseek_v41", the language
// model's keys nested in text_config (model_type "deepseek_v41_text") beside
// a vision_config.
bool is_deepseek_v41(const json::Value& c) {
  auto type_is = [](const json::Value& v, const char* want) {
    const json::Value* t = v.is_object() ? v.find("model_type") : nullptr;
    return t && t->is_string() && t->as_string("model_type") == want;
  };
  const json::Value* text = c.find("text_config");
  return type_is(c, "deepseek_v41") || (text && type_is(*text, "deepseek_v41_text"));
}

void read_block_range(const ConfigKeys& k, int layer, bool mtp) {
  if (mtp) {
    const json::Value* n = k.find("num_nextn_predict_layers", "n_mtp_layers");
    NVFP4_CHECK(!n || layer < n->as_int(k.what("num_nextn_predict_layers", "n_mtp_layers")), k.src(),
                ": MTP block ", layer, " does not exist: ", k.what("num_nextn_predict_layers", "n_mtp_layers"),
                " is ", n ? json::dump(*n) : "");
    return;
  }
  const json::Value* n = k.find("num_hidden_layers", "n_layers");
  NVFP4_CHECK(!n || layer < n->as_int(k.what("num_hidden_layers", "n_layers")), k.src(), ": layer ", layer,
              " does not exist: ", k.what("num_hidden_layers", "n_layers"), " is ", n ? json::dump(*n) : "");
}

}  // namespace

MoeConfig read_moe_config(const ModelDir& dir, int layer, bool mtp) {
  NVFP4_CHECK(!dir.config_json().empty(), dir.path(), ": no config.json");
  NVFP4_CHECK(layer >= 0, "read_moe_config: layer must be >= 0, got ", layer);
  const std::string src = dir.path() + "/" + dir.config_name();
  const json::Value root = json::parse(dir.config_json(), src);
  NVFP4_CHECK(root.is_object(), src, ": must hold a JSON object");
  // A multimodal config (DeepSeek-V4.1) keeps the language model's keys in
  // text_config.
  const json::Value* text = root.find("text_config");
  const bool nested = text && text->is_object() && !root.find("hidden_size");
  const json::Value& c = nested ? *text : root;
  const ConfigKeys k(c, nested ? src + " (text_config)" : src);
  const bool v41 = is_deepseek_v41(root);
  NVFP4_CHECK(!(v41 && mtp), src, ": DeepSeek-V4.1's draft blocks mtp.N (DSpark: dspark_n_routed_experts routed "
              "experts, top dspark_num_experts_per_tok) are not read yet; its main layers are");
  MoeConfig m;
  m.hidden = k.integer("hidden_size", "dim", std::nullopt, 1, kMaxWidth);
  m.intermediate = k.integer("moe_intermediate_size", "moe_inter_dim", std::nullopt, 1, kMaxWidth);
  m.experts = k.integer("n_routed_experts", nullptr, std::nullopt, 1, kMaxExperts);
  m.top_k = k.integer("num_experts_per_tok", "n_activated_experts", std::nullopt, 1, kMaxExperts);
  m.shared_experts = k.integer("n_shared_experts", nullptr, 0, 0, kMaxExperts);
  m.routed_scaling_factor = float(k.number("routed_scaling_factor", "route_scale", 1.0));
  if (const json::Value* l = k.find("swiglu_limit")) {
    const double v = l->as_double(src + ": key \"swiglu_limit\"");
    NVFP4_CHECK(std::isfinite(v) && v >= 0, src, ": key \"swiglu_limit\" is ", v, " (must be finite and >= 0)");
    if (v > 0) m.swiglu_limit = float(v);  // 0: no clamp, as DeepSeek's inference code reads it
  }
  if (const json::Value* s = k.find("scoring_func", "score_func"))
    m.scoring = parse_scoring(s->as_string(k.what("scoring_func", "score_func")), k.what("scoring_func", "score_func"));
  if (const json::Value* n = k.find("norm_topk_prob")) m.norm_topk_prob = n->as_bool(src + ": key \"norm_topk_prob\"");
  read_block_range(k, layer, mtp);
  // DeepSeek-V4.1 has no hash-routed layers (no num_hash_layers, no tid2eid;
  // vLLM's deepseek_v41 model passes num_hash_layers = 0).
  m.hash_routed = !mtp && layer_is_hash_routed(k, c, layer, v41 ? 0 : 3);
  try {
    m.validate();
  } catch (const Error& e) {
    NVFP4_FAIL(src, ": ", e.what());
  }
  return m;
}

// ---- writing ----------------------------------------------------------------

namespace {

const char* scoring_name(Scoring s) {
  return s == Scoring::Sigmoid ? "sigmoid" : s == Scoring::Softmax ? "softmax" : "sqrtsoftplus";
}

void set_common_keys(json::Value& j, const MoeConfig& c, int layer) {
  using json::Value;
  j.set("architectures", Value::array({Value::string("DeepseekV4ForCausalLM")}));
  j.set("model_type", Value::string("deepseek_v4"));
  j.set("hidden_size", Value::integer(c.hidden));
  j.set("moe_intermediate_size", Value::integer(c.intermediate));
  j.set("n_routed_experts", Value::integer(c.experts));
  j.set("num_experts_per_tok", Value::integer(c.top_k));
  j.set("n_shared_experts", Value::integer(c.shared_experts));
  j.set("routed_scaling_factor", Value::number(c.routed_scaling_factor));
  j.set("swiglu_limit", c.swiglu_limit ? Value::number(*c.swiglu_limit) : Value());
  j.set("scoring_func", Value::string(scoring_name(c.scoring)));
  j.set("norm_topk_prob", Value::boolean(c.norm_topk_prob));
  j.set("num_hidden_layers", Value::integer(layer + 1));
}

}  // namespace

std::string moe_config_json(const MoeConfig& c, int layer, CheckpointLayout layout) {
  using json::Value;
  Value j = Value::object();
  set_common_keys(j, c, layer);
  if (layout == CheckpointLayout::HuggingFace) {
    // Every layer up to this one is spelled out, so the num_hash_layers default
    // (3) cannot make a layer hash-routed by accident.
    Value types = Value::array();
    for (int l = 0; l <= layer; ++l) types.push(Value::string(l == layer && c.hash_routed ? "hash_moe" : "moe"));
    j.set("mlp_layer_types", std::move(types));
    j.set("quantization_config", Value::object({{"quant_method", Value::string("modelopt")},
                                                {"quant_algo", Value::string("NVFP4")},
                                                {"group_size", Value::integer(16)}}));
    return json::dump(j, 2) + "\n";
  }
  // DeepSeek's published config.json keys, and the quantization_config that
  // ModelOpt's DeepSeek-V4 export writes: FP8 for the rest of the model,
  // moe_quant_algo NVFP4, and the manifest with its exclusions as "ignore".
  j.set("num_hash_layers", Value::integer(c.hash_routed ? layer + 1 : 0));
  j.set("num_nextn_predict_layers", Value::integer(0));
  j.set("topk_method", Value::string("noaux_tc"));
  j.set("expert_dtype", Value::string("fp4"));
  Value q = mixed_precision_manifest({MoeNames(layout, MoeBlock{layer, false}).experts_module()},
                                     deepseek_excluded_modules());
  Value qc = Value::object({{"activation_scheme", Value::string("dynamic")},
                            {"fmt", Value::string("e4m3")},
                            {"quant_method", Value::string("fp8")},
                            {"scale_fmt", Value::string("ue8m0")},
                            {"weight_block_size", Value::array({Value::integer(128), Value::integer(128)})},
                            {"moe_quant_algo", Value::string("NVFP4")}});
  for (const auto& [key, v] : q.members()) qc.set(key == "exclude_modules" ? "ignore" : key, v);
  j.set("quantization_config", std::move(qc));
  return json::dump(j, 2) + "\n";
}

}  // namespace nvfp4moe
