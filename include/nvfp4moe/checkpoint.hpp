// nvfp4moe — checkpoints: safetensors files, Hugging Face model directories,
// and ModelOpt NVFP4 expert weights (spec section 4).
//
// Reading is memory-mapped and zero-copy: a TensorInfo points into the mapped
// file. Every malformed input (truncated file, header length beyond the file,
// non-JSON header, offsets outside or overlapping the data, shape/dtype/byte
// count mismatch, unknown dtype, missing tensors, NaN in a global scale) is an
// nvfp4moe::Error naming the file, the tensor and the values. Writing goes to a
// temporary name that is renamed when complete, so a failed write leaves the
// earlier file intact.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nvfp4moe/moe.hpp"
#include "nvfp4moe/types.hpp"

namespace nvfp4moe {

// Parses a safetensors dtype string ("F32", "BF16", "F8_E4M3", "U8", ...);
// throws naming the string for an unknown one.
DType parse_safetensors_dtype(const std::string& s);

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;  // into the mapped file
  uint64_t nbytes = 0;
  int64_t numel() const;
  // The tensor's values as f32 (F32/F16/BF16/F64 only; throws otherwise).
  std::vector<float> to_f32() const;
};

// A read-only, memory-mapped safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // validates the whole header
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const TensorInfo& get(const std::string& name) const;   // throws naming file and tensor
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  uint64_t size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Parses and validates a safetensors header (the bytes after the 8-byte
// length) against a data section of `data_size` bytes. Exposed for the fuzzer.
struct SafetensorsHeader {
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin, end;  // offsets into the data section
  };
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
};
SafetensorsHeader parse_safetensors_header(const char* json, size_t len, uint64_t data_size,
                                           const std::string& file_for_errors = "<memory>");

// Collects tensors and writes one safetensors file: header padded to 8 bytes,
// data aligned, written to "<path>.tmp.<pid>" and renamed.
class SafetensorsWriter {
 public:
  // Copies nothing: `data` must stay valid until write().
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // Takes ownership of the bytes.
  void add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes);
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    std::shared_ptr<std::vector<uint8_t>> owned;
  };
  std::vector<Item> items_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face model directory: one model.safetensors, or shards listed by
// model.safetensors.index.json (every listed tensor must be in its shard; a
// tensor in two shards is an error); config.json; hf_quant_config.json if
// present. `path` may also be a single .safetensors file (no config then).
class ModelDir {
 public:
  explicit ModelDir(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& tensor) const;
  const TensorInfo& get(const std::string& tensor) const;  // throws naming dir and tensor
  std::vector<std::string> tensor_names() const;
  const std::string& config_json() const { return config_json_; }  // "" if absent
  // "NVFP4" when hf_quant_config.json or config.json's quantization_config says so, else "".
  const std::string& quant_algo() const { return quant_algo_; }

 private:
  std::string path_, config_json_, quant_algo_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
};

// The MoE config of layer `layer` from config.json (keys of spec section 4 and
// issue #3: hidden_size, moe_intermediate_size, n_routed_experts,
// num_experts_per_tok required; n_shared_experts (0), routed_scaling_factor
// (1), swiglu_limit (none), scoring_func ("sqrtsoftplus"), norm_topk_prob
// (true) optional; hash-routed when mlp_layer_types[layer] == "hash_moe", else
// when layer < num_hash_layers (3 when absent)). Errors name the key.
MoeConfig read_moe_config(const ModelDir& dir, int layer);

struct LoadOptions {
  bool static_l1_input = false;  // use the checkpoint's input_scale for x
  bool static_l2_input = false;  // use the down projections' input_scale for h
  int64_t first_expert = 0;      // expert-parallel rank: load experts [first, first + count)
  int64_t expert_count = -1;     // -1 = all
};

// Loads layer `layer`'s MoE: ModelOpt NVFP4 experts into ExpertWeights (gate
// and up fused per expert as w13, each keeping its weight_scale_2), router,
// bias, tid2eid for hash layers, shared expert (bf16). Validates shapes,
// dtypes, global scales (NaN/Inf/<=0) and block-scale bytes (NaN, negative),
// naming the tensor and expert. Input scales: w13_input_scale[e] =
// max(gate, up input_scale), w2_input_scale[e] = down's, filled when every
// loaded expert has them (required with static_l1_input / static_l2_input);
// the backends use the max over experts as the one static g of x.
// docs/checkpoints.md has the names, dtypes and shapes.
MoeWeights load_moe_layer(const ModelDir& dir, int layer, const LoadOptions& options = {});

// Writes `weights` as layer `layer` of a Hugging Face DeepSeek-V4 directory
// (config.json, hf_quant_config.json, model.safetensors) — used by tests, the
// demo and the Python adapter.
void save_moe_layer(const std::string& dir, int layer, const MoeWeights& weights);

}  // namespace nvfp4moe
