// `nvfp4moe inspect PATH [--json] [--layer L]`: the tensors of a .safetensors
// file or model directory (dtype, shape, bytes), the quantization recognised
// per layer, for every ModelOpt NVFP4 weight its global scale and the range of
// its decoded block scales, and the MoE config when config.json is there.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <regex>

#include "checkpoint/model_files.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cli {

namespace {

struct Nvfp4Info {
  std::string prefix;
  float global_scale = 0;
  float scale_min = 0, scale_max = 0;  // decoded UE4M3 block scales
  std::string error;                   // a malformed triple, reported instead of thrown
};

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// "model.layers.12.mlp..." -> 12, else -1.
int layer_of(const std::string& name) {
  static const std::regex re(R"(^model\.layers\.([0-9]+)\.)");
  std::smatch m;
  if (!std::regex_search(name, m, re)) return -1;
  return int(std::stol(m[1].str()));
}

Nvfp4Info describe_nvfp4(const ModelDir& dir, const std::string& prefix) {
  Nvfp4Info info;
  info.prefix = prefix;
  try {
    Nvfp4Names n(prefix);
    const TensorInfo& s = dir.get(n.weight_scale);
    info.global_scale = read_global_scale(dir.get(n.weight_scale_2));
    float lo = INFINITY, hi = 0.0f;
    for (uint64_t i = 0; i < s.nbytes; ++i) {
      float v = e4m3_decode(s.data[i]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    info.scale_min = s.nbytes ? lo : 0.0f;
    info.scale_max = hi;
  } catch (const Error& e) {
    info.error = e.what();
  }
  return info;
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

const char* scoring_name(Scoring s) {
  return s == Scoring::Sigmoid ? "sigmoid" : s == Scoring::Softmax ? "softmax" : "sqrtsoftplus";
}

json::Value config_value(const MoeConfig& c) {
  using json::Value;
  return Value::object({{"hidden_size", Value::integer(c.hidden)},
                        {"moe_intermediate_size", Value::integer(c.intermediate)},
                        {"n_routed_experts", Value::integer(c.experts)},
                        {"num_experts_per_tok", Value::integer(c.top_k)},
                        {"n_shared_experts", Value::integer(c.shared_experts)},
                        {"routed_scaling_factor", Value::number(c.routed_scaling_factor)},
                        {"swiglu_limit", c.swiglu_limit ? Value::number(*c.swiglu_limit) : Value()},
                        {"scoring_func", Value::string(scoring_name(c.scoring))},
                        {"norm_topk_prob", Value::boolean(c.norm_topk_prob)}});
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  Args args(argc, argv, {"json", "help"});
  if (args.has("help") || args.positional().empty()) {
    std::fprintf(args.has("help") ? stdout : stderr,
                 "usage: nvfp4moe inspect PATH [--json] [--layer L]\n"
                 "  PATH: a .safetensors file or a model directory (sharded too).\n");
    return args.has("help") ? 0 : 2;
  }
  args.allow_only({"json", "help", "layer"});
  NVFP4_CHECK(args.positional().size() == 1, "inspect takes one PATH, got ", args.positional().size());
  const ModelDir dir(args.positional()[0]);
  const bool as_json = args.has("json");

  // NVFP4 triples and per-layer counts.
  std::vector<Nvfp4Info> nvfp4;
  std::map<int, std::pair<int, int>> per_layer;  // layer -> (NVFP4 weights, other weights)
  const auto names = dir.tensor_names();
  for (const auto& name : names) {
    if (!ends_with(name, ".weight")) continue;
    const std::string prefix = name.substr(0, name.size() - 7);
    const bool q = dir.get(name).dtype == DType::U8 && dir.has(prefix + ".weight_scale") &&
                   dir.has(prefix + ".weight_scale_2");
    auto& counts = per_layer[layer_of(name)];
    (q ? counts.first : counts.second)++;
    if (q) nvfp4.push_back(describe_nvfp4(dir, prefix));
  }
  std::optional<MoeConfig> moe;
  std::string moe_error;
  const int layer = int(args.get_int("layer", -1));
  if (!dir.config_json().empty()) {
    try {
      // The first layer that has routed experts, unless --layer names one.
      int l = layer >= 0 ? layer : (per_layer.empty() ? 0 : std::max(0, per_layer.begin()->first));
      moe = read_moe_config(dir, l);
    } catch (const Error& e) {
      moe_error = e.what();
    }
  }

  if (as_json) {
    using json::Value;
    Value root = Value::object();
    root.set("path", Value::string(dir.path()));
    root.set("quant_algo", Value::string(dir.quant_algo()));
    Value tensors = Value::array();
    for (const auto& name : names) {
      const TensorInfo& t = dir.get(name);
      Value shape = Value::array();
      for (int64_t d : t.shape) shape.push(Value::integer(d));
      tensors.push(Value::object({{"name", Value::string(name)},
                                  {"dtype", Value::string(dtype_name(t.dtype))},
                                  {"shape", std::move(shape)},
                                  {"bytes", Value::integer(int64_t(t.nbytes))}}));
    }
    root.set("tensors", std::move(tensors));
    Value layers = Value::array();
    for (const auto& [l, c] : per_layer)
      layers.push(Value::object({{"layer", Value::integer(l)},
                                 {"nvfp4_weights", Value::integer(c.first)},
                                 {"other_weights", Value::integer(c.second)}}));
    root.set("layers", std::move(layers));
    Value q = Value::array();
    for (const auto& i : nvfp4) {
      Value v = Value::object({{"prefix", Value::string(i.prefix)}});
      if (i.error.empty()) {
        v.set("global_scale", Value::number(i.global_scale));
        v.set("block_scale_min", Value::number(i.scale_min));
        v.set("block_scale_max", Value::number(i.scale_max));
      } else {
        v.set("error", Value::string(i.error));
      }
      q.push(std::move(v));
    }
    root.set("nvfp4", std::move(q));
    if (moe) root.set("moe_config", config_value(*moe));
    if (!moe_error.empty()) root.set("moe_config_error", Value::string(moe_error));
    std::printf("%s\n", json::dump(root, 2).c_str());
    return 0;
  }

  std::printf("%s: %zu tensors%s%s\n", dir.path().c_str(), names.size(),
              dir.quant_algo().empty() ? "" : ", quant_algo ", dir.quant_algo().c_str());
  for (const auto& name : names) {
    const TensorInfo& t = dir.get(name);
    std::printf("  %-72s %-8s %-18s %12llu B\n", name.c_str(), dtype_name(t.dtype), shape_str(t.shape).c_str(),
                (unsigned long long)t.nbytes);
  }
  std::printf("quantization per layer:\n");
  for (const auto& [l, c] : per_layer) {
    std::string where = l < 0 ? std::string("(no layer)") : "layer " + std::to_string(l);
    std::printf("  %-12s %d NVFP4 (ModelOpt) weights, %d other weights\n", where.c_str(), c.first, c.second);
  }
  if (!nvfp4.empty()) {
    std::printf("NVFP4 weights (global scale g; decoded block scale min..max):\n");
    for (const auto& i : nvfp4) {
      if (i.error.empty())
        std::printf("  %-64s g=%.6g  scales %.6g..%.6g\n", i.prefix.c_str(), i.global_scale, i.scale_min,
                    i.scale_max);
      else
        std::printf("  %-64s MALFORMED: %s\n", i.prefix.c_str(), i.error.c_str());
    }
  }
  if (moe) {
    std::printf("MoE config: H=%lld I=%lld E=%lld top_k=%lld shared=%lld rho=%g swiglu_limit=%s scoring=%s "
                "norm_topk_prob=%s hash_routed(layer)=%s\n",
                (long long)moe->hidden, (long long)moe->intermediate, (long long)moe->experts,
                (long long)moe->top_k, (long long)moe->shared_experts, moe->routed_scaling_factor,
                moe->swiglu_limit ? std::to_string(*moe->swiglu_limit).c_str() : "none", scoring_name(moe->scoring),
                moe->norm_topk_prob ? "true" : "false", moe->hash_routed ? "yes" : "no");
  } else if (!moe_error.empty()) {
    std::printf("MoE config: not readable: %s\n", moe_error.c_str());
  }
  return 0;
}

}  // namespace nvfp4moe::cli
