// One DeepSeek-V4 MoE layer from a checkpoint of either layout.
//
// Routed experts are ModelOpt NVFP4 or the official release's MXFP4; each
// expert's tensors map onto ExpertWeights: w13 holds gate's I rows then up's
// I rows, NVFP4 ones each keeping its own weight_scale_2 in w13_global[e] =
// {g_gate, g_up}, MXFP4 ones their UE8M0 scale bytes as stored. Another
// format (FP8, BF16) or a mix is refused naming it and the layer.
//
// Static L1 input scale: the contract speaks of "one static g from the
// checkpoint's input_scale", but checkpoints store one per expert and
// projection. We keep w13_input_scale[e] = max(gate.input_scale,
// up.input_scale); the backends take the max over all experts as the single
// static g, so no expert's calibrated activation range can overflow UE4M3.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "checkpoint/mxfp4_weights.hpp"
#include "checkpoint/shared_expert_io.hpp"
#include "checkpoint/weight_format.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

void append(std::vector<uint8_t>& dst, const TensorInfo& t) { dst.insert(dst.end(), t.data, t.data + t.nbytes); }

// Every projection of every loaded expert must be NVFP4, or every one MXFP4;
// the first that is neither, or differs from the first expert's, names the
// layer and the format it found.
ExpertFormat routed_expert_format(const ModelDir& dir, const MoeNames& names, int64_t first, int64_t count) {
  std::optional<WeightFormat> layer_format;
  std::string first_prefix;
  for (int64_t e = first; e < first + count; ++e)
    for (Proj p : kProjs) {
      const std::string prefix = names.expert(e, p);
      const WeightFormat f = classify_weight(dir, prefix);
      NVFP4_CHECK(f != WeightFormat::Missing, dir.path(), ": missing tensor \"", prefix, ".weight\" (",
                  names.label(), ", expert ", e, ")");
      NVFP4_CHECK(f == WeightFormat::Nvfp4 || f == WeightFormat::Mxfp4, names.label(), ": routed experts are ",
                  weight_format_name(f), " (", describe_weight(dir, prefix),
                  "); nvfp4moe runs NVFP4 and MXFP4 routed experts");
      if (!layer_format) {
        layer_format = f;
        first_prefix = prefix;
      }
      NVFP4_CHECK(f == *layer_format, names.label(), ": routed experts are ", weight_format_name(f), " (",
                  describe_weight(dir, prefix), ") but ", first_prefix, " is ", weight_format_name(*layer_format),
                  "; the experts of one layer share one format");
    }
  return layer_format == WeightFormat::Mxfp4 ? ExpertFormat::Mxfp4 : ExpertFormat::Nvfp4;
}

// One MXFP4 projection of N rows and K columns (the official layout, checked
// by read_mxfp4_weight), appended to codes / scales; codes stay as stored.
void load_mxfp4_projection(const ModelDir& dir, const std::string& prefix, int64_t N, int64_t K,
                           std::vector<uint8_t>& codes, std::vector<uint8_t>& scales) {
  const Mxfp4WeightView v = read_mxfp4_weight(dir, prefix, N, K);
  append(codes, *v.weight);
  append(scales, *v.scale);
}

void load_mxfp4_experts(const ModelDir& dir, const MoeNames& names, const LoadOptions& o, const MoeConfig& cfg,
                        ExpertWeights& ex) {
  NVFP4_CHECK(!o.static_l1_input && !o.static_l2_input, dir.path(), ": static input scales requested but ",
              names.label(), " has MXFP4 routed experts, which carry no input_scale");
  const int64_t H = cfg.hidden, I = cfg.intermediate;
  for (int64_t e = ex.first_expert; e < ex.first_expert + ex.count; ++e) {
    for (Proj p : {Proj::Gate, Proj::Up})
      load_mxfp4_projection(dir, names.expert(e, p), I, H, ex.w13_codes, ex.w13_scales);
    load_mxfp4_projection(dir, names.expert(e, Proj::Down), H, I, ex.w2_codes, ex.w2_scales);
  }
}

// A manifest that gives the layer's experts NVFP4 must give them groups of 16.
void check_manifest(const ModelDir& dir, const MoeNames& names) {
  const QuantManifest& m = dir.quant_manifest();
  const std::string module = names.experts_module();
  if (m.algo_of(module) != "NVFP4") return;
  const int64_t g = m.group_size_of(module);
  NVFP4_CHECK(g == 0 || g == 16, dir.path(), ": the quantization manifest gives ", module, " NVFP4 with group_size ",
              g, "; NVFP4 blocks hold 16 elements");
}

// One NVFP4 projection of N rows and K columns, validated (nvfp4_weight.hpp)
// and appended to codes / scales.
void load_projection(const ModelDir& dir, const std::string& prefix, int64_t N, int64_t K,
                     std::vector<uint8_t>& codes, std::vector<uint8_t>& scales, std::vector<float>& global) {
  const Nvfp4Weight w = read_nvfp4_weight(dir, prefix, std::pair{N, K}, Nvfp4Read::Everything);
  append(codes, *w.codes);
  append(scales, *w.scales);
  global.push_back(w.global_scale);
}

void load_routed_experts(const ModelDir& dir, const MoeNames& names, const LoadOptions& o, const MoeConfig& cfg,
                         ExpertWeights& ex) {
  const int64_t H = cfg.hidden, I = cfg.intermediate, first = ex.first_expert, count = ex.count;
  std::vector<float> l1_in, l2_in;
  bool l1_complete = true, l2_complete = true;
  for (int64_t e = first; e < first + count; ++e) {
    float in13 = 0.0f;
    bool have13 = false;
    for (Proj p : {Proj::Gate, Proj::Up}) {
      const Nvfp4Names n(names.expert(e, p));
      load_projection(dir, names.expert(e, p), I, H, ex.w13_codes, ex.w13_scales, ex.w13_global);
      if (dir.has(n.input_scale)) {
        in13 = std::max(in13, read_global_scale(dir.get(n.input_scale)));
        have13 = true;
      } else {
        NVFP4_CHECK(!o.static_l1_input, dir.path(), ": static L1 input scale requested but tensor \"",
                    n.input_scale, "\" is missing");
      }
    }
    if (have13) l1_in.push_back(in13);
    else l1_complete = false;

    const Nvfp4Names d(names.expert(e, Proj::Down));
    load_projection(dir, names.expert(e, Proj::Down), H, I, ex.w2_codes, ex.w2_scales, ex.w2_global);
    if (dir.has(d.input_scale)) {
      l2_in.push_back(read_global_scale(dir.get(d.input_scale)));
    } else {
      NVFP4_CHECK(!o.static_l2_input, dir.path(), ": static L2 input scale requested but tensor \"",
                  d.input_scale, "\" is missing");
      l2_complete = false;
    }
  }
  if (l1_complete && count > 0) ex.w13_input_scale = std::move(l1_in);
  if (l2_complete && count > 0) ex.w2_input_scale = std::move(l2_in);
}

void load_tid2eid(const TensorInfo& t, const MoeConfig& cfg, RouterWeights& r) {
  NVFP4_CHECK(t.dtype == DType::I32 || t.dtype == DType::I64, "tensor \"", t.name, "\": dtype ",
              dtype_name(t.dtype), ", expected I32");
  NVFP4_CHECK(t.shape.size() == 2 && t.shape[1] == cfg.top_k, "tensor \"", t.name, "\": shape ",
              shape_text(t.shape), ", expected [vocab, top_k=", cfg.top_k, "]");
  r.vocab = t.shape[0];
  r.tid2eid.resize(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    int64_t v;
    if (t.dtype == DType::I32) {
      int32_t x;
      std::memcpy(&x, t.data + 4 * i, 4);
      v = x;
    } else {
      std::memcpy(&v, t.data + 8 * i, 8);
    }
    NVFP4_CHECK(v >= 0 && v < cfg.experts, "tensor \"", t.name, "\": entry ", i, " (token ", i / cfg.top_k,
                ") is expert ", v, ", outside [0, E=", cfg.experts, ")");
    r.tid2eid[size_t(i)] = int32_t(v);
  }
}

// Router: all E experts (routing is global even on an expert-parallel rank).
void load_router(const ModelDir& dir, const MoeNames& names, const MoeConfig& cfg, RouterWeights& r) {
  const int64_t E = cfg.experts, H = cfg.hidden;
  const TensorInfo& gate = dir.get(names.router_weight());
  NVFP4_CHECK(gate.dtype == DType::F32 || gate.dtype == DType::BF16 || gate.dtype == DType::F16, "tensor \"",
              gate.name, "\": dtype ", dtype_name(gate.dtype), ", expected BF16 or F32");
  NVFP4_CHECK(gate.shape == std::vector<int64_t>({E, H}), "tensor \"", gate.name, "\": shape ",
              shape_text(gate.shape), ", expected ", shape_text({E, H}));
  r.gate = gate.to_f32();
  if (dir.has(names.router_bias())) {
    const TensorInfo& b = dir.get(names.router_bias());
    NVFP4_CHECK(b.dtype == DType::F32 || b.dtype == DType::BF16, "tensor \"", b.name, "\": dtype ",
                dtype_name(b.dtype), ", expected F32");
    NVFP4_CHECK(b.shape == std::vector<int64_t>({E}), "tensor \"", b.name, "\": shape ", shape_text(b.shape),
                ", expected ", shape_text({E}));
    r.bias = b.to_f32();
  } else {
    r.bias.assign(size_t(E), 0.0f);
  }
  if (cfg.hash_routed) load_tid2eid(dir.get(names.tid2eid()), cfg, r);
}

}  // namespace

MoeWeights load_moe_layer(const ModelDir& dir, int layer, const LoadOptions& options) {
  const MoeNames names(dir.layout(), MoeBlock{layer, options.mtp});
  MoeWeights w;
  MoeConfig& cfg = w.config;
  cfg = read_moe_config(dir, layer, options.mtp);
  const int64_t E = cfg.experts, first = options.first_expert;
  const int64_t count = options.expert_count < 0 ? E - first : options.expert_count;
  NVFP4_CHECK(first >= 0 && count >= 0 && first + count <= E, "load_moe_layer: experts [", first, ", ",
              first + count, ") outside [0, E=", E, ")");
  check_manifest(dir, names);

  ExpertWeights& ex = w.experts;
  ex.format = routed_expert_format(dir, names, first, count);
  ex.count = count;
  ex.first_expert = first;
  ex.hidden = cfg.hidden;
  ex.intermediate = cfg.intermediate;
  if (ex.format == ExpertFormat::Mxfp4) load_mxfp4_experts(dir, names, options, cfg, ex);
  else load_routed_experts(dir, names, options, cfg, ex);
  cfg.l1_input = options.static_l1_input ? InputScaleMode::Static : InputScaleMode::Dynamic;
  cfg.l2_input = options.static_l2_input ? InputScaleMode::Static : InputScaleMode::Dynamic;
  // NVFP4 experts default to NVFP4 activations (as on Blackwell), MXFP4 ones
  // to DeepSeek's FP8 activations (its inference code for FP4 experts).
  cfg.activation = options.activation.value_or(ex.format == ExpertFormat::Mxfp4 ? ActivationMode::Fp8
                                                                                 : ActivationMode::Nvfp4);
  ex.validate();
  load_router(dir, names, cfg, w.router);
  if (cfg.shared_experts > 0) load_shared_expert(dir, names, cfg, w.shared);
  cfg.validate();
  return w;
}

}  // namespace nvfp4moe
