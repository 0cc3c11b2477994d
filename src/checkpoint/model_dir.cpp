// Hugging Face model directories: the tensors of model.safetensors or of the
// shards that model.safetensors.index.json lists, config.json, the
// quantization manifest (hf_quant_config.json as ModelOpt writes it, or
// config.json's quantization_config) and the naming layout of the tensors.
#include <set>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {
constexpr const char* kIndexName = "model.safetensors.index.json";
constexpr const char* kSingleName = "model.safetensors";
}  // namespace

namespace {

// The shards an index lists, in order of first mention.
std::vector<std::string> shards_of_index(const json::Value& index, const std::string& index_path) {
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

}  // namespace

std::vector<std::string> model_shard_files(const std::string& dir) {
  const std::string index_path = fileio::join(dir, kIndexName);
  if (fileio::exists(index_path))
    return shards_of_index(json::parse(fileio::read_file(index_path), index_path), index_path);
  NVFP4_CHECK(fileio::exists(fileio::join(dir, kSingleName)), dir, ": no ", kSingleName, " and no ", kIndexName);
  return {kSingleName};
}

namespace {

// Both layouts in one checkpoint would make every name lookup ambiguous.
CheckpointLayout layout_of_tensors(const std::map<std::string, const TensorInfo*>& tensors,
                                   const std::string& path) {
  const std::string* first[2] = {nullptr, nullptr};  // HuggingFace, DeepSeek
  for (const auto& [name, t] : tensors)
    if (const std::optional<CheckpointLayout> l = layout_of_name(name); l && !first[int(*l)]) first[int(*l)] = &name;
  NVFP4_CHECK(!(first[0] && first[1]), path, ": mixes the Hugging Face layout (tensor \"", first[0] ? *first[0] : "",
              "\") and the DeepSeek layout (tensor \"", first[1] ? *first[1] : "", "\")");
  return first[1] ? CheckpointLayout::DeepSeek : CheckpointLayout::HuggingFace;
}

}  // namespace

ModelDir::ModelDir(const std::string& path) : path_(path) {
  std::vector<std::string> files;
  std::string hf_quant;
  const std::string index_path = fileio::join(path, kIndexName);
  const bool indexed = fileio::is_directory(path) && fileio::exists(index_path);
  json::Value index;  // parsed once: a full model's index lists ~300k tensors
  if (indexed) index = json::parse(fileio::read_file(index_path), index_path);
  if (fileio::is_directory(path)) {
    for (const auto& shard : indexed ? shards_of_index(index, index_path) : model_shard_files(path))
      files.push_back(fileio::join(path, shard));
    // config.json; DeepSeek's inference/config.json (its own key names) when that is all there is.
    for (const char* name : {"config.json", "inference/config.json"}) {
      if (!fileio::exists(fileio::join(path, name))) continue;
      config_json_ = fileio::read_file(fileio::join(path, name));
      config_name_ = name;
      break;
    }
    const std::string hq = fileio::join(path, "hf_quant_config.json");
    if (fileio::exists(hq)) hf_quant = fileio::read_file(hq);
    manifest_ = parse_quant_manifest(config_name_ == "config.json" ? config_json_ : "", hf_quant, path);
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
  if (indexed) {
    for (const auto& [tensor, file] : index.find("weight_map")->members()) {
      auto it = tensors_.find(tensor);
      NVFP4_CHECK(it != tensors_.end(), index_path, ": tensor \"", tensor, "\" is listed in shard \"",
                  file.as_string(), "\" but missing from it");
    }
  }
  layout_ = layout_of_tensors(tensors_, path);
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

}  // namespace nvfp4moe
