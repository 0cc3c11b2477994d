// Internal helpers shared by ModelDir, the MoE loader/saver and the CLI's
// checkpoint rewriting (quantize, dequantize, inspect).
#pragma once

#include <functional>
#include <utility>
#include <string>
#include <vector>

#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"

namespace nvfp4moe {

// The shard file names of a model directory (index order), or
// {"model.safetensors"}; throws naming the directory when neither exists.
std::vector<std::string> model_shard_files(const std::string& dir);

// The manifest of a directory from the texts of its config.json and
// hf_quant_config.json ("" when absent); errors name `dir` and the key.
QuantManifest parse_quant_manifest(const std::string& config_json, const std::string& hf_quant_json,
                                   const std::string& dir);

// hf_quant_config.json as ModelOpt writes it, produced by nvfp4moe: the plain
// NVFP4 form, and the MIXED_PRECISION form of ModelOpt's DeepSeek-V4 export
// (`nvfp4_modules` each {"quant_algo": "NVFP4", "group_size": 16}). Both
// carry "kv_cache_quant_algo": null (no KV-cache quantization), which vLLM's
// ModelOptNvFp4Config requires next to group_size and exclude_modules.
std::string hf_quant_config_text(const std::vector<std::string>& exclude_modules);
std::string hf_quant_config_mixed_text(const std::vector<std::string>& nvfp4_modules,
                                       const std::vector<std::string>& exclude_modules);
// config.json's quantization_config for NVFP4 weights without input scales,
// in the form ModelOpt's Hugging Face export writes (its
// convert_hf_quant_config_format): quant_method "modelopt", the exclusions
// as "ignore" (vLLM reads this object before hf_quant_config.json, so
// without them it would quantize every linear layer), and one config group
// of 4-bit float weights in groups of 16 and no input activations.
json::Value nvfp4_weight_only_quantization_config(const std::vector<std::string>& exclude_modules);
// The exclusions ModelOpt's DeepSeek-V4 export lists: attention and shared
// experts stay FP8, the head unconverted, the MTP blocks in their format.
std::vector<std::string> deepseek_excluded_modules();
// The "quantization" object of the MIXED_PRECISION form.
json::Value mixed_precision_manifest(const std::vector<std::string>& nvfp4_modules,
                                     const std::vector<std::string>& exclude_modules);

// config.json for one saved layer: transformers' keys with mlp_layer_types
// (HuggingFace), or DeepSeek's published keys with num_hash_layers and the
// quantization_config of ModelOpt's DeepSeek-V4 export (DeepSeek).
std::string moe_config_json(const MoeConfig& c, int layer, CheckpointLayout layout);

// ModelOpt NVFP4 tensor names of one linear weight "<prefix>.weight".
struct Nvfp4Names {
  std::string weight, weight_scale, weight_scale_2, input_scale;
  explicit Nvfp4Names(const std::string& prefix)
      : weight(prefix + ".weight"),
        weight_scale(prefix + ".weight_scale"),
        weight_scale_2(prefix + ".weight_scale_2"),
        input_scale(prefix + ".input_scale") {}
};

// The tensors of one MoE block (routed experts, router, shared expert) added
// to `st` under `names`; `w` must outlive st.write(). Validates `w` first.
class MoeNames;
void append_moe_layer(SafetensorsWriter& st, const MoeNames& names, const MoeWeights& w);

// A global scale tensor (F32, shape [] or [1]) as its value; throws naming the
// tensor if the dtype/shape is off or the value is NaN, Inf or <= 0.
float read_global_scale(const TensorInfo& t);

// Rewrites a checkpoint tensor by tensor: `in` and `out` are both .safetensors
// files or both model directories (sharded ones keep their shards; the index
// is rewritten for the new tensor names). For every input file, `transform`
// fills a writer from the file; it reports progress through `tick` (tensor
// done). Directory output: every file is written into a staging directory
// next to `out` and moved into `out` only when all succeeded, so a failure
// leaves `out` as it was. `config_edit` rewrites config.json's text (it
// receives "" when absent); `extra_files` are written next to it.
struct RewriteSpec {
  std::function<void(const SafetensorsFile& in, SafetensorsWriter& out)> transform;
  std::function<std::string(const std::string& config_json)> config_edit;
  std::vector<std::pair<std::string, std::string>> extra_files;  // (name, content)
  std::vector<std::string> drop_files;  // names not to carry over (e.g. hf_quant_config.json)
  bool copy_directories = false;        // also carry over subdirectories (inference/, encoding/, ...)
};
void rewrite_checkpoint(const std::string& in, const std::string& out, const RewriteSpec& spec);

}  // namespace nvfp4moe
