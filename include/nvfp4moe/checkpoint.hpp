// nvfp4moe — checkpoints: safetensors files, Hugging Face model directories,
// and DeepSeek-V4 MoE layers in both checkpoint layouts (docs/checkpoints.md).
//
// Reading is memory-mapped and zero-copy: a TensorInfo points into the mapped
// file. Every malformed input (truncated file, header length beyond the file,
// non-JSON header, offsets outside or overlapping the data, shape/dtype/byte
// count mismatch, unknown dtype, missing tensors, NaN in a global scale) is an
// nvfp4moe::Error naming the file, the tensor and the values. Writing goes to a
// temporary name that is renamed when complete, so a failed write leaves the
// earlier file intact.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
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
  // Where the bytes of `t` (one of tensors()) start in the file: for reads
  // that go through pread rather than the mapping.
  uint64_t file_offset(const TensorInfo& t) const;

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

// The file SafetensorsWriter::write is writing, open to the filler (see
// set_filler): its header is in place and every tensor has its offset, so
// the bytes of a deferred tensor can be written whenever they exist, in any
// order and from any thread.
class SafetensorsStream {
 public:
  SafetensorsStream(const SafetensorsStream&) = delete;
  SafetensorsStream& operator=(const SafetensorsStream&) = delete;

  // The byte count of tensor `index` (the order of the writer's add calls).
  uint64_t bytes(size_t index) const { return sizes_[index]; }
  // Bytes [at, at + n) of tensor `index`. Thread-safe; the pieces written
  // for one tensor must not overlap. Writeback of large pieces is started
  // at once, so the final fsync does not find the whole file dirty.
  void write(size_t index, const void* data, uint64_t n, uint64_t at = 0);

 private:
  friend class SafetensorsWriter;
  SafetensorsStream(int fd, const std::string& path, std::vector<uint64_t> offsets, std::vector<uint64_t> sizes);
  void write_at(uint64_t file_offset, const void* data, uint64_t n);
  const std::string* first_incomplete(const std::vector<std::string>& names) const;

  int fd_;
  const std::string& path_;
  std::vector<uint64_t> offsets_, sizes_;  // per tensor, in the file
  std::unique_ptr<std::atomic<uint64_t>[]> written_;
};

// Collects tensors and writes one safetensors file: header padded to 8 bytes,
// data aligned, written to "<path>.tmp.<pid>" and renamed.
class SafetensorsWriter {
 public:
  // Copies nothing: `data` must stay valid until write().
  void add(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data);
  // Takes ownership of the bytes.
  void add_owned(const std::string& name, DType dtype, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes);
  // A tensor whose bytes the filler writes during write(); returns its index
  // for SafetensorsStream::write.
  size_t add_deferred(const std::string& name, DType dtype, std::vector<int64_t> shape);
  // write() calls `fill` once the header and the tensors added with their
  // bytes are in the file; it must write every byte of every deferred tensor
  // (else write() fails naming the first one short) before it returns.
  void set_filler(std::function<void(SafetensorsStream&)> fill);
  void set_metadata(const std::string& key, const std::string& value);
  void write(const std::string& path) const;

 private:
  struct Item {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    std::shared_ptr<std::vector<uint8_t>> owned;
    bool deferred = false;  // bytes from the filler
  };
  // Checks the name, the shape and (unless deferred) the data; the new item.
  Item& push(const std::string& name, DType dtype, std::vector<int64_t> shape, const void* data, bool deferred);
  std::vector<Item> items_;
  std::set<std::string> names_;
  std::map<std::string, std::string> metadata_;
  std::function<void(SafetensorsStream&)> fill_;
};

// The two naming schemes of DeepSeek-V4 checkpoints (docs/checkpoints.md):
//   DeepSeek     the official release and NVIDIA's NVFP4 export of it:
//                layers.{L}.ffn.experts.{e}.w{1,3,2}.*, layers.{L}.ffn.gate.{weight,
//                bias,tid2eid}, layers.{L}.ffn.shared_experts.w{1,3,2}.*, and the
//                MTP blocks mtp.{i}.ffn.*; w1 = gate, w3 = up, w2 = down.
//   HuggingFace  transformers' names: model.layers.{L}.mlp.experts.{e}.{gate,up,
//                down}_proj.*, mlp.gate.{weight,e_score_correction_bias,tid2eid},
//                mlp.shared_experts.{gate,up,down}_proj.*.
enum class CheckpointLayout : uint8_t { HuggingFace, DeepSeek };
const char* layout_name(CheckpointLayout layout);  // "huggingface" | "deepseek"
CheckpointLayout parse_layout(const std::string& s);  // the names above; throws otherwise

// The storage format of one linear weight, from its tensors' names and dtypes:
//   Nvfp4     ModelOpt: weight U8 [N, K/2] + weight_scale F8_E4M3 [N, K/16] + weight_scale_2
//             (told by the names; the loader checks dtypes and shapes)
//   Mxfp4     the official release's experts: weight I8/U8 [N, K/2] (or F4 [N, K]) + scale F8_E8M0 [N, K/32]
//   Fp8Block  weight F8_E4M3 [N, K] + scale (F8_E8M0 or F32) or weight_scale_inv (F32), 128x128 tiles
//   Bf16      weight BF16 / F16 / F32 and no scale
enum class WeightFormat : uint8_t { Nvfp4, Mxfp4, Fp8Block, Bf16, Missing, Unknown };
const char* weight_format_name(WeightFormat f);  // "NVFP4", "MXFP4", "FP8", "BF16", "missing", "unknown"

// The quantization manifest: hf_quant_config.json as ModelOpt writes it
// ({"quantization": {"quant_algo", "group_size", "quantized_layers",
// "exclude_modules"}}), else config.json's quantization_config.
struct QuantManifest {
  std::string quant_algo;      // "NVFP4", "MIXED_PRECISION", "" (none)
  std::string moe_quant_algo;  // config.json quantization_config.moe_quant_algo ("NVFP4" on ModelOpt's DeepSeek-V4 export)
  std::string quant_method;    // config.json quantization_config.quant_method ("fp8", "modelopt", ...)
  int64_t group_size = 0;      // 0 = not given
  std::map<std::string, std::string> quantized_layers;  // MIXED_PRECISION: module -> its quant_algo
  std::map<std::string, int64_t> quantized_group_size;  // module -> its group_size (0 = not given)
  std::vector<std::string> exclude_modules;              // patterns, '*' matches any run of characters
  // The algorithm given to `module` (e.g. "layers.3.ffn.experts"): "" when it
  // matches exclude_modules; MIXED_PRECISION: the quantized_layers entry of the
  // module or of modules below it ("layers.3.ffn.experts.0.w1", as older exports
  // list them; all must agree, else "mixed"), "" when none; otherwise quant_algo.
  std::string algo_of(const std::string& module) const;
  // The group size given to `module` (its quantized_layers entries, else
  // group_size); 0 when none; entries that disagree give -1.
  int64_t group_size_of(const std::string& module) const;
};

// A Hugging Face model directory: one model.safetensors, or shards listed by
// model.safetensors.index.json (every listed tensor must be in its shard; a
// tensor in two shards is an error); config.json (or, without it, DeepSeek's
// inference/config.json); hf_quant_config.json if present. `path` may also
// be a single .safetensors file (no config then). Only headers are read.
class ModelDir {
 public:
  explicit ModelDir(const std::string& path);
  const std::string& path() const { return path_; }
  bool has(const std::string& tensor) const;
  const TensorInfo& get(const std::string& tensor) const;  // throws naming dir and tensor
  std::vector<std::string> tensor_names() const;
  const std::string& config_json() const { return config_json_; }  // "" if absent
  // Which file config_json() came from ("config.json", "inference/config.json" or "").
  const std::string& config_name() const { return config_name_; }
  // "NVFP4" / "MIXED_PRECISION" when hf_quant_config.json or config.json's
  // quantization_config says so, else "".
  const std::string& quant_algo() const { return manifest_.quant_algo; }
  const QuantManifest& quant_manifest() const { return manifest_; }
  // From the tensor names: DeepSeek when they start "layers." or "mtp.",
  // HuggingFace when "model.layers." (also when neither occurs); both kinds in
  // one checkpoint is an error naming one tensor of each.
  CheckpointLayout layout() const { return layout_; }

 private:
  std::string path_, config_json_, config_name_;
  QuantManifest manifest_;
  CheckpointLayout layout_ = CheckpointLayout::HuggingFace;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
};

// The MoE config of main layer `layer` (or, with mtp, of MTP block `layer`)
// from the model config. Keys, Hugging Face spelling first, DeepSeek's
// inference/config.json spelling second (both may appear; differing values
// are an error naming both keys): hidden_size | dim, moe_intermediate_size |
// moe_inter_dim, n_routed_experts, num_experts_per_tok | n_activated_experts
// required; n_shared_experts (0), routed_scaling_factor | route_scale (1),
// swiglu_limit (none; 0 = none), scoring_func | score_func ("sqrtsoftplus"),
// norm_topk_prob (true) optional. A main layer is hash-routed when
// mlp_layer_types[layer] == "hash_moe", else when layer < num_hash_layers |
// n_hash_layers (3 when absent; 0 for DeepSeek-V4.1); an MTP block never is,
// and must be below num_nextn_predict_layers | n_mtp_layers when given.
// DeepSeek-V4.1 (model_type "deepseek_v41"): the keys are read from
// text_config, and its draft blocks (DSpark) are refused. Errors name the key.
MoeConfig read_moe_config(const ModelDir& dir, int layer, bool mtp = false);

// The MoE blocks of a checkpoint summarised from headers and config, for
// inspecting whole model directories (the official DeepSeek-V4-Pro is 64
// shards, ~900 GB) in seconds. Tensor data is read only for the 0-d global
// scales of routed experts (weight_scale_2, input_scale) and the 128x128 tile
// scales of FP8 shared experts (a few KB a layer), and not at all when
// `read_values` is false. Nothing malformed throws: it is listed in problems.
struct ValueRange {
  float min = 0, max = 0;
  int64_t count = 0;  // values seen; 0 = none
  void add(float v);
};
struct MoeLayerSummary {
  std::string block;          // "layers.3", "model.layers.3", "mtp.0"
  int index = 0;              // layer (or MTP block) number
  bool mtp = false;           // an MTP block
  int64_t experts = 0;        // routed experts found (distinct ids)
  std::string routed_format;  // weight_format_name() of every projection, or "mixed"
  std::string shared_format;  // "BF16", "FP8", "" (no shared expert), or another weight_format_name()
  std::string router;         // "hash" (tid2eid), "scored", "" (no gate weight)
  bool bias = false;          // a selection bias is present
  bool loadable = false;      // load_moe_layer takes it: NVFP4 or MXFP4 routed experts and no problem found
  std::string manifest_algo;  // what the quantization manifest gives the experts module ("" = nothing)
  ValueRange weight_scale_2;  // routed NVFP4 experts' global scales
  ValueRange input_scale;     // their static input scales
  ValueRange shared_scale;    // FP8 shared expert's tile factors
  std::vector<std::string> problems;  // malformed or inconsistent, each naming the tensor or key
};
std::vector<MoeLayerSummary> summarize_moe_layers(const ModelDir& dir, bool read_values = true);

struct LoadOptions {
  bool static_l1_input = false;  // use the checkpoint's input_scale for x
  bool static_l2_input = false;  // use the down projections' input_scale for h
  int64_t first_expert = 0;      // expert-parallel rank: load experts [first, first + count)
  int64_t expert_count = -1;     // -1 = all
  bool mtp = false;              // `layer` indexes the MTP blocks (mtp.{layer}.ffn, DeepSeek layout)
  // The routed experts' activation mode (MoeConfig::activation); none: nvfp4
  // for NVFP4 experts, fp8 (DeepSeek's own) for MXFP4 experts.
  std::optional<ActivationMode> activation;
};

// Loads one MoE layer of either layout (ModelDir::layout()): ModelOpt NVFP4
// routed experts into ExpertWeights (gate and up fused per expert as w13, each
// keeping its weight_scale_2), or the official release's MXFP4 ones (weight
// I8/U8/F4 + UE8M0 `scale`, ExpertFormat::Mxfp4), router, bias, tid2eid for
// hash layers, shared expert (BF16, or FP8 E4M3 with 128x128 tile scales:
// F8_E8M0 `scale` or F32 `weight_scale_inv`; DeepSeek-V4.1's 32x32 ones are
// read as the exact BF16 values). Routed experts in another format
// (FP8, BF16) or in two formats are refused naming the format and the layer.
// Validates shapes, dtypes, global scales (NaN/Inf/<=0), block-scale bytes
// (NaN, negative), FP8 shared weights and scales (NaN), naming the tensor and
// the index. Input scales: w13_input_scale[e] = max(gate, up input_scale),
// w2_input_scale[e] = down's, filled when every loaded expert has them
// (required with static_l1_input / static_l2_input); the backends use the max
// over experts as the one static g of x. docs/checkpoints.md has the names,
// dtypes and shapes.
MoeWeights load_moe_layer(const ModelDir& dir, int layer, const LoadOptions& options = {});

struct SaveOptions {
  CheckpointLayout layout = CheckpointLayout::HuggingFace;  // the names to write
};

// Writes `weights` as layer `layer` of a DeepSeek-V4 directory in the given
// layout (config.json, hf_quant_config.json, model.safetensors) — used by
// tests, the demo and the Python adapter. HuggingFace: the names above, a
// transformers-style config, hf_quant_config NVFP4. DeepSeek: the official
// names, DeepSeek's config keys with ModelOpt's quantization_config, and
// hf_quant_config MIXED_PRECISION listing the layer's experts as NVFP4. Each
// projection gets its own weight_scale_2 (w1 and w3 carry equal values when
// ModelOpt made them, as it does); an FP8 shared expert's tile factors are
// written as F8_E8M0 `scale` bytes in the DeepSeek layout when every one is a
// power of two, else as F32 (`scale` / `weight_scale_inv`).
void save_moe_layer(const std::string& dir, int layer, const MoeWeights& weights, const SaveOptions& options = {});

}  // namespace nvfp4moe
