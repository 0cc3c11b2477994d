// The quantization manifest of a model directory: hf_quant_config.json as
// ModelOpt writes it, both forms — plain {"quant_algo": "NVFP4", "group_size":
// 16, "exclude_modules": [...]}, and MIXED_PRECISION with "quantized_layers"
// {module: {"quant_algo", "group_size"}} as its DeepSeek-V4 export writes it
// (NVIDIA/Model-Optimizer, examples/deepseek/deepseek_v4/quantize_to_nvfp4.py)
// — else config.json's quantization_config, whose exclusions that export
// spells "ignore". Writing: both forms.
#include <set>

#include "checkpoint/model_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

const std::string* string_key(const json::Value& obj, const char* key, const std::string& src) {
  const json::Value* v = obj.find(key);
  if (!v || v->is_null()) return nullptr;
  return &v->as_string(src + ": key \"" + key + "\"");
}

int64_t int_or_zero(const json::Value& obj, const char* key, const std::string& src) {
  const json::Value* v = obj.find(key);
  return v && !v->is_null() ? v->as_int(src + ": key \"" + key + "\"") : 0;
}

// The fields shared by hf_quant_config.json's "quantization" and config.json's
// quantization_config; `exclude_key` is "exclude_modules" or "ignore".
void read_manifest_fields(const json::Value& q, const std::string& src, const char* exclude_key, QuantManifest& m) {
  NVFP4_CHECK(q.is_object(), src, ": must be a JSON object, got ", json::kind_name(q.kind()));
  if (const std::string* a = string_key(q, "quant_algo", src)) m.quant_algo = *a;
  m.group_size = int_or_zero(q, "group_size", src);
  if (const json::Value* layers = q.find("quantized_layers"); layers && !layers->is_null()) {
    for (const auto& [module, entry] : layers->members(src + ": key \"quantized_layers\"")) {
      const std::string what = src + ": quantized_layers[\"" + module + "\"]";
      NVFP4_CHECK(entry.is_object(), what, " must be an object, got ", json::kind_name(entry.kind()));
      const std::string* a = string_key(entry, "quant_algo", what);
      NVFP4_CHECK(a, what, " has no \"quant_algo\"");
      m.quantized_layers[module] = *a;
      m.quantized_group_size[module] = int_or_zero(entry, "group_size", what);
    }
  }
  if (const json::Value* ex = q.find(exclude_key); ex && !ex->is_null())
    for (const auto& p : ex->items(src + ": key \"" + exclude_key + "\""))
      m.exclude_modules.push_back(p.as_string(src + ": entry of \"" + exclude_key + "\""));
}

// '*' matches any run of characters (also none); everything else itself.
bool glob_match(std::string_view pattern, std::string_view s) {
  size_t p = 0, i = 0, star = std::string_view::npos, mark = 0;
  while (i < s.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = i;
    } else if (p < pattern.size() && pattern[p] == s[i]) {
      ++p;
      ++i;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      i = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

}  // namespace

QuantManifest parse_quant_manifest(const std::string& config_json, const std::string& hf_quant_json,
                                   const std::string& dir) {
  QuantManifest m;
  if (!config_json.empty()) {
    const std::string src = dir + "/config.json";
    json::Value c = json::parse(config_json, src);
    if (const json::Value* qc = c.is_object() ? c.find("quantization_config") : nullptr; qc && qc->is_object()) {
      const std::string qsrc = src + ": quantization_config";
      if (const std::string* a = string_key(*qc, "moe_quant_algo", qsrc)) m.moe_quant_algo = *a;
      if (const std::string* a = string_key(*qc, "quant_method", qsrc)) m.quant_method = *a;
      if (hf_quant_json.empty()) {
        read_manifest_fields(*qc, qsrc, "ignore", m);
        if (m.exclude_modules.empty()) read_manifest_fields(*qc, qsrc, "exclude_modules", m);
      }
    }
  }
  if (!hf_quant_json.empty()) {
    const std::string src = dir + "/hf_quant_config.json";
    json::Value h = json::parse(hf_quant_json, src);
    NVFP4_CHECK(h.is_object(), src, ": must hold a JSON object");
    if (const json::Value* q = h.find("quantization"); q && !q->is_null())
      read_manifest_fields(*q, src + ": quantization", "exclude_modules", m);
  }
  return m;
}

namespace {

// The values of `entries` for `module` and the modules below it ("m", "m.*").
template <typename V>
std::set<V> entries_of(const std::map<std::string, V>& entries, const std::string& module) {
  std::set<V> found;
  for (auto it = entries.lower_bound(module); it != entries.end(); ++it) {
    const std::string& k = it->first;
    if (k.compare(0, module.size(), module) != 0) break;
    if (k.size() == module.size() || k[module.size()] == '.') found.insert(it->second);
  }
  return found;
}

}  // namespace

std::string QuantManifest::algo_of(const std::string& module) const {
  for (const std::string& p : exclude_modules)
    if (glob_match(p, module)) return "";
  if (quant_algo != "MIXED_PRECISION") return quant_algo;
  const std::set<std::string> algos = entries_of(quantized_layers, module);
  if (algos.empty()) return "";
  return algos.size() == 1 ? *algos.begin() : "mixed";
}

int64_t QuantManifest::group_size_of(const std::string& module) const {
  std::set<int64_t> sizes = entries_of(quantized_group_size, module);
  sizes.erase(0);
  if (sizes.empty()) return group_size;
  return sizes.size() == 1 ? *sizes.begin() : -1;
}

std::string hf_quant_config_text(const std::vector<std::string>& exclude_modules) {
  using json::Value;
  Value ex = Value::array();
  for (const auto& m : exclude_modules) ex.push(Value::string(m));
  Value j = Value::object(
      {{"producer", Value::object({{"name", Value::string("nvfp4moe")}, {"version", Value::string("0.1.0")}})},
       {"quantization", Value::object({{"quant_algo", Value::string("NVFP4")},
                                       {"kv_cache_quant_algo", Value()},
                                       {"group_size", Value::integer(16)},
                                       {"exclude_modules", std::move(ex)}})}});
  return json::dump(j, 2) + "\n";
}

json::Value nvfp4_weight_only_quantization_config(const std::vector<std::string>& exclude_modules) {
  using json::Value;
  Value ignore = Value::array();
  for (const auto& m : exclude_modules) ignore.push(Value::string(m));
  const Value weights = Value::object({{"dynamic", Value::boolean(false)}, {"num_bits", Value::integer(4)},
                                       {"type", Value::string("float")}, {"group_size", Value::integer(16)}});
  // No "input_activations": the files hold no input_scale, and vLLM runs a
  // group without them as weight-only NVFP4 (W4A16) instead of reading an
  // input scale that was never loaded.
  Value groups = Value::object(
      {{"group_0", Value::object({{"weights", weights}, {"targets", Value::array({Value::string("Linear")})}})}});
  return Value::object({{"quant_method", Value::string("modelopt")},
                        {"quant_algo", Value::string("NVFP4")},
                        {"group_size", Value::integer(16)},
                        {"config_groups", std::move(groups)},
                        {"ignore", std::move(ignore)},
                        {"producer", Value::object({{"name", Value::string("nvfp4moe")},
                                                    {"version", Value::string("0.1.0")}})}});
}

std::vector<std::string> deepseek_excluded_modules() {
  return {"*.attn.*", "*.ffn.shared_experts.*", "head", "mtp.*"};
}

json::Value mixed_precision_manifest(const std::vector<std::string>& nvfp4_modules,
                                     const std::vector<std::string>& exclude_modules) {
  using json::Value;
  Value layers = Value::object();
  for (const auto& m : nvfp4_modules)
    layers.set(m, Value::object({{"quant_algo", Value::string("NVFP4")}, {"group_size", Value::integer(16)}}));
  Value ex = Value::array();
  for (const auto& m : exclude_modules) ex.push(Value::string(m));
  return Value::object({{"quant_algo", Value::string("MIXED_PRECISION")},
                        {"kv_cache_quant_algo", Value()},
                        {"group_size", Value::integer(16)},
                        {"quantized_layers", std::move(layers)},
                        {"exclude_modules", std::move(ex)}});
}

std::string hf_quant_config_mixed_text(const std::vector<std::string>& nvfp4_modules,
                                       const std::vector<std::string>& exclude_modules) {
  using json::Value;
  Value j = Value::object(
      {{"producer", Value::object({{"name", Value::string("nvfp4moe")}, {"version", Value::string("0.1.0")}})},
       {"quantization", mixed_precision_manifest(nvfp4_modules, exclude_modules)}});
  return json::dump(j, 2) + "\n";
}

}  // namespace nvfp4moe
