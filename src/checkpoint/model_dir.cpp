// Hugging Face model directories: the tensors of model.safetensors or of the
// shards that model.safetensors.index.json lists, config.json, and the
// quantization algorithm (hf_quant_config.json as ModelOpt writes it, or
// config.json's quantization_config).
#include <set>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
}  // namespace

std::vector<std::string> model_shard_files(const std::string& dir) {
  const std::string index_path = fileio::join(dir, kIndexName);
  if (fileio::exists(index_path)) {
    json::Value index = json::parse(fileio::read_file(index_path), index_path);
    const json::Value* map = index.find("weight_map");
    NVFP4_CHECK(map && map->is_object(), index_path, ": missing the \"weight_map\" object");
    std::vector<std::string> shards;
    std::set<std::string> seen;
    for (const auto& [tensor, file] : map->members()) {
      const std::string& f = file.as_string(index_path + ": weight_map[\"" + tensor + "\"]");
      NVFP4_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..", index_path,
                  ": weight_map[\"", tensor, "\"] names an invalid shard file \"", f, "\"");
      if (seen.insert(f).second) shards.push_back(f);
    }
    return shards;
  }
  NVFP4_CHECK(fileio::exists(fileio::join(dir, kSingleName)), dir, ": no ", kSingleName, " and no ", kIndexName);
  return {kSingleName};
}

std::string quant_algo_of(const std::string& config_json, const std::string& hf_quant_json,
                          const std::string& dir) {
  if (!hf_quant_json.empty()) {
    json::Value q = json::parse(hf_quant_json, dir + "/hf_quant_config.json");
    if (const json::Value* qz = q.find("quantization"))
      if (const json::Value* a = qz->find("quant_algo"); a && a->is_string()) return a->as_string();
  }
  if (!config_json.empty()) {
    json::Value c = json::parse(config_json, dir + "/config.json");
    if (const json::Value* qc = c.find("quantization_config"))
      if (const json::Value* a = qc->find("quant_algo"); a && a->is_string()) return a->as_string();
  }
  return "";
}

ModelDir::ModelDir(const std::string& path) : path_(path) {
  std::vector<std::string> files;
  if (fileio::is_directory(path)) {
    for (const auto& shard : model_shard_files(path)) files.push_back(fileio::join(path, shard));
    const std::string cfg = fileio::join(path, "config.json");
    if (fileio::exists(cfg)) config_json_ = fileio::read_file(cfg);
    const std::string hq = fileio::join(path, "hf_quant_config.json");
    quant_algo_ = quant_algo_of(config_json_, fileio::exists(hq) ? fileio::read_file(hq) : "", path);
  } else {
    files.push_back(path);  // a single .safetensors file
  }
  for (const auto& f : files) {
    files_.push_back(std::make_unique<SafetensorsFile>(f));
    for (const auto& t : files_.back()->tensors()) {
      auto [it, fresh] = tensors_.emplace(t.name, &t);
      NVFP4_CHECK(fresh, path, ": tensor \"", t.name, "\" appears in two shards (", f, " and another)");
    }
  }
  // Every tensor the index promises must be in its shard.
  const std::string index_path = fileio::join(path, kIndexName);
  if (fileio::is_directory(path) && fileio::exists(index_path)) {
    json::Value index = json::parse(fileio::read_file(index_path), index_path);
    for (const auto& [tensor, file] : index.find("weight_map")->members()) {
      auto it = tensors_.find(tensor);
      NVFP4_CHECK(it != tensors_.end(), index_path, ": tensor \"", tensor, "\" is listed in shard \"",
                  file.as_string(), "\" but missing from it");
    }
  }
}

bool ModelDir::has(const std::string& tensor) const { return tensors_.count(tensor) != 0; }

const TensorInfo& ModelDir::get(const std::string& tensor) const {
  auto it = tensors_.find(tensor);
  NVFP4_CHECK(it != tensors_.end(), path_, ": missing tensor \"", tensor, "\"");
  return *it->second;
}

std::vector<std::string> ModelDir::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [n, t] : tensors_) names.push_back(n);
  return names;
}

// ---- config.json -> MoeConfig -------------------------------------------------

namespace {

int64_t int_key(const json::Value& c, const char* key, const std::string& src, std::optional<int64_t> fallback) {
  const json::Value* v = c.find(key);
  if (!v || v->is_null()) {
    NVFP4_CHECK(fallback.has_value(), src, ": missing key \"", key, "\"");
    return *fallback;
  }
  return v->as_int(src + ": key \"" + key + "\"");
}

double num_key(const json::Value& c, const char* key, const std::string& src, double fallback) {
  const json::Value* v = c.find(key);
  if (!v || v->is_null()) return fallback;
  return v->as_double(src + ": key \"" + key + "\"");
}

}  // namespace

bool layer_is_hash_routed(const std::string& config_json, int layer, const std::string& src) {
  json::Value c = json::parse(config_json, src);
  if (const json::Value* types = c.find("mlp_layer_types"); types && !types->is_null()) {
    const auto& t = types->items(src + ": key \"mlp_layer_types\"");
    NVFP4_CHECK(layer >= 0 && size_t(layer) < t.size(), src, ": key \"mlp_layer_types\" has ", t.size(),
                " entries, no entry for layer ", layer);
    return t[size_t(layer)].as_string(src + ": mlp_layer_types[" + std::to_string(layer) + "]") == "hash_moe";
  }
  const int64_t n = int_key(c, "num_hash_layers", src, 3);
  return layer < n;
}

MoeConfig read_moe_config(const ModelDir& dir, int layer) {
  const std::string src = dir.path() + "/config.json";
  NVFP4_CHECK(!dir.config_json().empty(), dir.path(), ": no config.json");
  NVFP4_CHECK(layer >= 0, "read_moe_config: layer must be >= 0, got ", layer);
  json::Value c = json::parse(dir.config_json(), src);
  NVFP4_CHECK(c.is_object(), src, ": must hold a JSON object");
  MoeConfig m;
  m.hidden = int_key(c, "hidden_size", src, std::nullopt);
  m.intermediate = int_key(c, "moe_intermediate_size", src, std::nullopt);
  m.experts = int_key(c, "n_routed_experts", src, std::nullopt);
  m.top_k = int_key(c, "num_experts_per_tok", src, std::nullopt);
  m.shared_experts = int_key(c, "n_shared_experts", src, 0);
  m.routed_scaling_factor = float(num_key(c, "routed_scaling_factor", src, 1.0));
  if (const json::Value* l = c.find("swiglu_limit"); l && !l->is_null())
    m.swiglu_limit = float(l->as_double(src + ": key \"swiglu_limit\""));
  if (const json::Value* s = c.find("scoring_func"); s && !s->is_null()) {
    const std::string& f = s->as_string(src + ": key \"scoring_func\"");
    if (f == "sqrtsoftplus") m.scoring = Scoring::SqrtSoftplus;
    else if (f == "sigmoid") m.scoring = Scoring::Sigmoid;
    else if (f == "softmax") m.scoring = Scoring::Softmax;
    else NVFP4_FAIL(src, ": key \"scoring_func\" is \"", f, "\" (expected sqrtsoftplus, sigmoid or softmax)");
  }
  if (const json::Value* n = c.find("norm_topk_prob"); n && !n->is_null())
    m.norm_topk_prob = n->as_bool(src + ": key \"norm_topk_prob\"");
  m.hash_routed = layer_is_hash_routed(dir.config_json(), layer, src);
  try {
    m.validate();
  } catch (const Error& e) {
    NVFP4_FAIL(src, ": ", e.what());
  }
  return m;
}

}  // namespace nvfp4moe
