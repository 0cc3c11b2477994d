// `nvfp4moe inspect PATH [--json] [--layer L] [--summary] [--block-scales]
// [--headers-only] [--fp8-exact]`: the tensors of a .safetensors file or model directory
// (dtype, shape, bytes), the quantization recognised per layer, for every
// ModelOpt NVFP4 weight its global scale and the range of its decoded block
// scales, the MoE config when config.json is there, and a summary of every
// MoE layer (routed-expert and shared-expert formats, router kind, scale
// ranges, anything malformed).
//
// Whole model directories (~900 GB) take seconds: headers and config are
// read, tensor data only for 0-d global scales and FP8 shared-expert tile
// scales (summarize_moe_layers), and NVFP4 block scales only when they total
// at most kBlockScaleBudget bytes or --block-scales asks. --headers-only reads
// no tensor data at all; --summary leaves out the per-tensor lists.
// --fp8-exact loads the routed experts of each loadable layer (or of --layer
// L) and reports whether every row of their weights is E4M3 values times a
// power of two (e4m3_row_shifts), the condition of an FP8 tensor-core path:
// all of the experts' bytes are read, ~6 GB a DeepSeek-V4-Pro layer.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>

#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cli {

namespace {

// Block scales read by default: enough for any test or single-layer file,
// a small fraction of a full model's (~100 GB of block scales in DeepSeek-V4-Pro).
constexpr uint64_t kBlockScaleBudget = 256ull << 20;

struct Nvfp4Info {
  std::string prefix;
  float global_scale = 0;
  bool scales_read = false;
  float scale_min = 0, scale_max = 0;  // decoded UE4M3 block scales
  std::string error;                   // a malformed triple, reported instead of thrown
};

bool ends_with(const std::string& s, const char* suf) {
  size_t n = std::strlen(suf);
  return s.size() >= n && s.compare(s.size() - n, n, suf) == 0;
}

// "model.layers.12.mlp..." or "layers.12.ffn..." -> 12, else -1 (MTP
// blocks too); an index out of range throws naming the tensor.
int layer_of(const std::string& name) {
  const std::optional<MoeBlock> b = block_of_name(name);
  return b && !b->mtp ? b->index : -1;
}

Nvfp4Info describe_nvfp4(const ModelDir& dir, const std::string& prefix, bool read_global, bool read_blocks) {
  Nvfp4Info info;
  info.prefix = prefix;
  try {
    // The loader's validation (checkpoint/nvfp4_weight.hpp), to the depth asked for.
    const Nvfp4Read depth = !read_global ? Nvfp4Read::Headers : read_blocks ? Nvfp4Read::Everything : Nvfp4Read::Scalars;
    const Nvfp4Weight w = read_nvfp4_weight(dir, prefix, std::nullopt, depth);
    info.global_scale = w.global_scale;
    if (!read_blocks) return info;
    const TensorInfo& s = *w.scales;
    float lo = INFINITY, hi = 0.0f;
    for (uint64_t i = 0; i < s.nbytes; ++i) {
      float v = e4m3_decode(s.data[i]);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    info.scales_read = true;
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

json::Value range_value(const ValueRange& r) {
  using json::Value;
  if (!r.count) return Value();
  return Value::object({{"min", Value::number(r.min)}, {"max", Value::number(r.max)}, {"count", Value::integer(r.count)}});
}

json::Value layer_value(const MoeLayerSummary& s) {
  using json::Value;
  Value problems = Value::array();
  for (const std::string& p : s.problems) problems.push(Value::string(p));
  return Value::object({{"block", Value::string(s.block)},
                        {"index", Value::integer(s.index)},
                        {"mtp", Value::boolean(s.mtp)},
                        {"experts", Value::integer(s.experts)},
                        {"routed_format", Value::string(s.routed_format)},
                        {"shared_format", Value::string(s.shared_format)},
                        {"router", Value::string(s.router)},
                        {"bias", Value::boolean(s.bias)},
                        {"manifest_algo", Value::string(s.manifest_algo)},
                        {"loadable", Value::boolean(s.loadable)},
                        {"weight_scale_2", range_value(s.weight_scale_2)},
                        {"input_scale", range_value(s.input_scale)},
                        {"shared_scale", range_value(s.shared_scale)},
                        {"problems", std::move(problems)}});
}

std::string range_text(const ValueRange& r) {
  if (!r.count) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.4g..%.4g", r.min, r.max);
  return buf;
}

std::string not_loadable_reason(const MoeLayerSummary& s) {
  if (s.routed_format != "NVFP4" && s.routed_format != "MXFP4")
    return "not loadable (routed experts " + (s.routed_format.empty() ? std::string("absent") : s.routed_format) +
           "; nvfp4moe runs NVFP4 and MXFP4)";
  return "not loadable (see below)";
}

void print_layers(const std::vector<MoeLayerSummary>& layers) {
  std::printf("MoE layers (%zu):\n", layers.size());
  for (const auto& s : layers) {
    const std::string router = s.router.empty() ? "none" : s.router + (s.bias ? "+bias" : "");
    std::printf("  %-16s experts %s x%lld  shared %s  router %s  weight_scale_2 %s  input_scale %s  "
                "shared_scale %s  manifest %s  %s\n",
                s.block.c_str(), s.routed_format.empty() ? "none" : s.routed_format.c_str(), (long long)s.experts,
                s.shared_format.empty() ? "none" : s.shared_format.c_str(), router.c_str(),
                range_text(s.weight_scale_2).c_str(), range_text(s.input_scale).c_str(),
                range_text(s.shared_scale).c_str(), s.manifest_algo.empty() ? "-" : s.manifest_algo.c_str(),
                s.loadable ? "loadable" : not_loadable_reason(s).c_str());
    for (const std::string& p : s.problems) std::printf("    MALFORMED: %s\n", p.c_str());
  }
}

// Per layer: how many routed experts have every row of both projections as
// E4M3 values times a power of two, the shifts, and the first that has not.
// Also the condition of the FP8 form of the prefill GEMM (`run --fp8-mma`),
// which leaves NVFP4's g to the FP32 epilogue: the same check with g = 1
// (for MXFP4 the same count).
struct Fp8ExactLayer {
  std::string block;
  int64_t experts = 0, exact = 0, prefill = 0;
  int shift_min = 0, shift_max = 0;
  std::string first;          // "expert E w3: row R: ..." of the first expert that is not
  std::string first_prefill;  // the same for the prefill form's condition
};

Fp8ExactLayer fp8_exact_layer(const ModelDir& dir, const MoeLayerSummary& s) {
  LoadOptions o;
  o.mtp = s.mtp;
  const MoeWeights w = load_moe_layer(dir, s.index, o);
  const ExpertWeights& x = w.experts;
  Fp8ExactLayer out;
  out.block = s.block;
  out.experts = x.count;
  const int block = int(x.scale_block());
  const bool mx = x.format == ExpertFormat::Mxfp4;
  const int64_t H = x.hidden, I = x.intermediate;
  bool any_shift = false;
  // Rows of one projection of expert e (its w1, w3 or w2, one g each):
  // their shifts into the range, or the reason the expert is not exact.
  const float one = 1.0f;
  bool prefill = false;  // checking the prefill form's condition: g = 1, shifts not recorded
  auto check = [&](const char* name, int64_t e, const uint8_t* codes, const uint8_t* scales, const float* g,
                   int64_t rows, int64_t cols) {
    const E4m3RowShifts r = e4m3_row_shifts(codes, scales, block, mx ? nullptr : (prefill ? &one : g), 0, rows, cols);
    if (!r.exact) return "expert " + std::to_string(x.first_expert + e) + " " + name + ": " + r.why;
    if (prefill) return std::string();
    for (const int16_t v : r.shift) {
      out.shift_min = any_shift ? std::min(out.shift_min, int(v)) : int(v);
      out.shift_max = any_shift ? std::max(out.shift_max, int(v)) : int(v);
      any_shift = true;
    }
    return std::string();
  };
  auto expert = [&](int64_t e) {
    const uint8_t* c13 = x.w13_codes.data() + e * 2 * I * (H / 2);
    const uint8_t* s13 = x.w13_scales.data() + e * 2 * I * (H / block);
    const float* g13 = mx ? nullptr : &x.w13_global[size_t(2 * e)];
    std::string why = check("w1", e, c13, s13, g13, I, H);
    if (why.empty()) why = check("w3", e, c13 + I * (H / 2), s13 + I * (H / block), mx ? nullptr : g13 + 1, I, H);
    if (why.empty())
      why = check("w2", e, x.w2_codes.data() + e * H * (I / 2), x.w2_scales.data() + e * H * (I / block),
                  mx ? nullptr : &x.w2_global[size_t(e)], H, I);
    return why;
  };
  // Every expert: how many pass, and the first reason of one that does not.
  auto count = [&](int64_t& passing, std::string& first) {
    for (int64_t e = 0; e < x.count; ++e) {
      const std::string why = expert(e);
      if (why.empty())
        ++passing;
      else if (first.empty())
        first = why;
    }
  };
  count(out.exact, out.first);
  if (mx) {  // no global scale: the same rows
    out.prefill = out.exact;
    out.first_prefill = out.first;
    return out;
  }
  prefill = true;
  count(out.prefill, out.first_prefill);
  return out;
}

struct Inspection {
  std::vector<std::string> names;
  std::vector<Nvfp4Info> nvfp4;
  std::map<int, std::pair<int, int>> per_layer;  // layer -> (NVFP4 weights, other weights)
  bool block_scales_read = false;
  uint64_t block_scale_bytes = 0;
  std::optional<MoeConfig> moe;
  std::string moe_error;
  std::vector<MoeLayerSummary> layers;
  std::vector<Fp8ExactLayer> fp8_exact;  // --fp8-exact
};

Inspection inspect(const ModelDir& dir, const Args& args) {
  Inspection r;
  r.names = dir.tensor_names();
  const bool headers_only = args.has("headers-only");
  std::vector<std::string> prefixes;
  for (const auto& name : r.names) {
    if (!ends_with(name, ".weight")) continue;
    const std::string prefix = name.substr(0, name.size() - 7);
    // Packed codes with either scale: an NVFP4 weight, reported MALFORMED when incomplete.
    const bool has_scale = dir.has(prefix + ".weight_scale");
    const bool q = dir.get(name).dtype == DType::U8 && (has_scale || dir.has(prefix + ".weight_scale_2"));
    auto& counts = r.per_layer[layer_of(name)];
    (q ? counts.first : counts.second)++;
    if (q) {
      prefixes.push_back(prefix);
      if (has_scale) r.block_scale_bytes += dir.get(prefix + ".weight_scale").nbytes;
    }
  }
  r.block_scales_read = !headers_only && !args.has("summary") &&
                        (args.has("block-scales") || r.block_scale_bytes <= kBlockScaleBudget);
  // The per-weight list (global scale and block-scale range of each) is left out with --summary.
  if (!args.has("summary"))
    for (const auto& p : prefixes) r.nvfp4.push_back(describe_nvfp4(dir, p, !headers_only, r.block_scales_read));
  const int layer = int(args.get_int("layer", -1));
  if (!dir.config_json().empty()) {
    try {
      // The first layer that has routed experts, unless --layer names one.
      int l = layer >= 0 ? layer : (r.per_layer.empty() ? 0 : std::max(0, r.per_layer.begin()->first));
      r.moe = read_moe_config(dir, l);
    } catch (const Error& e) {
      r.moe_error = e.what();
    }
  }
  r.layers = summarize_moe_layers(dir, !headers_only);
  if (args.has("fp8-exact"))
    for (const MoeLayerSummary& s : r.layers)
      if (s.loadable && (layer < 0 || (s.index == layer && !s.mtp))) r.fp8_exact.push_back(fp8_exact_layer(dir, s));
  return r;
}

void print_json(const ModelDir& dir, const Inspection& r, bool summary) {
  using json::Value;
  Value root = Value::object();
  root.set("path", Value::string(dir.path()));
  root.set("quant_algo", Value::string(dir.quant_algo()));
  root.set("layout", Value::string(layout_name(dir.layout())));
  root.set("config_file", Value::string(dir.config_name()));
  root.set("tensor_count", Value::integer(int64_t(r.names.size())));
  if (!summary) {
    Value tensors = Value::array();
    for (const auto& name : r.names) {
      const TensorInfo& t = dir.get(name);
      Value shape = Value::array();
      for (int64_t d : t.shape) shape.push(Value::integer(d));
      tensors.push(Value::object({{"name", Value::string(name)},
                                  {"dtype", Value::string(dtype_name(t.dtype))},
                                  {"shape", std::move(shape)},
                                  {"bytes", Value::integer(int64_t(t.nbytes))}}));
    }
    root.set("tensors", std::move(tensors));
  }
  Value layers = Value::array();
  for (const auto& [l, c] : r.per_layer)
    layers.push(Value::object({{"layer", Value::integer(l)},
                               {"nvfp4_weights", Value::integer(c.first)},
                               {"other_weights", Value::integer(c.second)}}));
  root.set("layers", std::move(layers));
  root.set("block_scales_read", Value::boolean(r.block_scales_read));
  Value q = Value::array();
  for (const auto& i : r.nvfp4) {
    Value v = Value::object({{"prefix", Value::string(i.prefix)}});
    if (i.error.empty()) {
      v.set("global_scale", Value::number(i.global_scale));
      if (i.scales_read) {
        v.set("block_scale_min", Value::number(i.scale_min));
        v.set("block_scale_max", Value::number(i.scale_max));
      }
    } else {
      v.set("error", Value::string(i.error));
    }
    q.push(std::move(v));
  }
  if (!summary) root.set("nvfp4", std::move(q));
  if (r.moe) root.set("moe_config", config_value(*r.moe));
  if (!r.moe_error.empty()) root.set("moe_config_error", Value::string(r.moe_error));
  Value moe_layers = Value::array();
  for (const auto& s : r.layers) moe_layers.push(layer_value(s));
  root.set("moe_layers", std::move(moe_layers));
  if (!r.fp8_exact.empty()) {
    Value f = Value::array();
    for (const Fp8ExactLayer& l : r.fp8_exact) {
      Value v = Value::object({{"block", Value::string(l.block)},
                               {"experts", Value::integer(l.experts)},
                               {"exact_experts", Value::integer(l.exact)},
                               {"fp8_prefill_experts", Value::integer(l.prefill)},
                               {"shift_min", Value::integer(l.shift_min)},
                               {"shift_max", Value::integer(l.shift_max)}});
      if (!l.first.empty()) v.set("first_inexact", Value::string(l.first));
      if (!l.first_prefill.empty()) v.set("first_not_fp8_prefill", Value::string(l.first_prefill));
      f.push(std::move(v));
    }
    root.set("fp8_exact", std::move(f));
  }
  std::printf("%s\n", json::dump(root, 2).c_str());
}

void print_text(const ModelDir& dir, const Inspection& r, bool summary) {
  std::printf("%s: %zu tensors%s%s, %s layout\n", dir.path().c_str(), r.names.size(),
              dir.quant_algo().empty() ? "" : ", quant_algo ", dir.quant_algo().c_str(), layout_name(dir.layout()));
  if (!summary)
    for (const auto& name : r.names) {
      const TensorInfo& t = dir.get(name);
      std::printf("  %-72s %-8s %-18s %12llu B\n", name.c_str(), dtype_name(t.dtype), shape_str(t.shape).c_str(),
                  (unsigned long long)t.nbytes);
    }
  std::printf("quantization per layer:\n");
  for (const auto& [l, c] : r.per_layer) {
    std::string where = l < 0 ? std::string("(no layer)") : "layer " + std::to_string(l);
    std::printf("  %-12s %d NVFP4 (ModelOpt) weights, %d other weights\n", where.c_str(), c.first, c.second);
  }
  if (!r.nvfp4.empty()) {
    std::printf("NVFP4 weights (global scale g; decoded block scale min..max):\n");
    if (!r.block_scales_read)
      std::printf("  (block scales not read: %.3g GB of them; --block-scales reads them)\n",
                  double(r.block_scale_bytes) * 1e-9);
    for (const auto& i : r.nvfp4) {
      if (!i.error.empty())
        std::printf("  %-64s MALFORMED: %s\n", i.prefix.c_str(), i.error.c_str());
      else if (i.scales_read)
        std::printf("  %-64s g=%.6g  scales %.6g..%.6g\n", i.prefix.c_str(), i.global_scale, i.scale_min,
                    i.scale_max);
      else
        std::printf("  %-64s g=%.6g\n", i.prefix.c_str(), i.global_scale);
    }
  }
  if (r.moe) {
    const MoeConfig* m = &*r.moe;
    std::printf("MoE config: H=%lld I=%lld E=%lld top_k=%lld shared=%lld rho=%g swiglu_limit=%s scoring=%s "
                "norm_topk_prob=%s hash_routed(layer)=%s\n",
                (long long)m->hidden, (long long)m->intermediate, (long long)m->experts, (long long)m->top_k,
                (long long)m->shared_experts, m->routed_scaling_factor,
                m->swiglu_limit ? std::to_string(*m->swiglu_limit).c_str() : "none", scoring_name(m->scoring),
                m->norm_topk_prob ? "true" : "false", m->hash_routed ? "yes" : "no");
  } else if (!r.moe_error.empty()) {
    std::printf("MoE config: not readable: %s\n", r.moe_error.c_str());
  }
  if (!r.layers.empty()) print_layers(r.layers);
  if (!r.fp8_exact.empty()) {
    std::printf("routed experts as E4M3 x 2^r per row (an FP8 tensor-core path's condition):\n");
    for (const Fp8ExactLayer& l : r.fp8_exact) {
      std::printf("  %-16s %lld of %lld experts exact", l.block.c_str(), (long long)l.exact, (long long)l.experts);
      if (l.exact > 0) std::printf(", shifts r %d..%d", l.shift_min, l.shift_max);
      std::printf("\n");
      if (!l.first.empty()) std::printf("    first that is not: %s\n", l.first.c_str());
      std::printf("    FP8 prefill form (run --fp8-mma, g left to the epilogue): %lld of %lld experts%s\n",
                  (long long)l.prefill, (long long)l.experts, l.prefill == l.experts ? ", the layer qualifies" : "");
      if (!l.first_prefill.empty()) std::printf("    first that does not: %s\n", l.first_prefill.c_str());
    }
  }
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  const Args args(argc, argv,
                  {flag("json"), flag("help"), flag("summary"), flag("block-scales"), flag("headers-only"),
                   flag("fp8-exact"), integer("layer", 0, kMaxLayer)},
                  1);
  if (args.has("help") || args.positional().empty()) {
    std::fprintf(args.has("help") ? stdout : stderr,
                 "usage: nvfp4moe inspect PATH [--json] [--layer L] [--summary] [--block-scales] [--headers-only]\n"
                 "                        [--fp8-exact]\n"
                 "  PATH: a .safetensors file or a model directory (sharded too, either layout).\n"
                 "  --summary: leave out the per-tensor and per-weight lists (whole models).\n"
                 "  --block-scales: read NVFP4 block scales even beyond 256 MB of them.\n"
                 "  --headers-only: read no tensor data (no scale values or ranges).\n"
                 "  --fp8-exact: load each MoE layer's routed experts (or --layer L's) and report whether\n"
                 "    every weight row is E4M3 values times a power of two (reads all their bytes).\n");
    return args.has("help") ? 0 : 2;
  }
  const ModelDir dir(args.positional()[0]);
  const Inspection r = inspect(dir, args);
  if (args.has("json"))
    print_json(dir, r, args.has("summary"));
  else
    print_text(dir, r, args.has("summary"));
  return 0;
}

}  // namespace nvfp4moe::cli
