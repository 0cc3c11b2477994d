// One DeepSeek-V4 MoE layer from / to a ModelOpt NVFP4 checkpoint (spec 4).
//
// Loading maps the per-projection tensors onto ExpertWeights: w13 holds, per
// expert, gate's I rows then up's I rows, each keeping its own weight_scale_2
// in w13_global[e] = {g_gate, g_up}.
//
// Static L1 input scale: the spec speaks of "one static g from the
// checkpoint's input_scale", but checkpoints store one per expert and
// projection. We keep w13_input_scale[e] = max(gate.input_scale,
// up.input_scale); the backends take the max over all experts as the single
// static g, so no expert's calibrated activation range can overflow UE4M3.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

void expect(const TensorInfo& t, DType dtype, const std::vector<int64_t>& shape) {
  NVFP4_CHECK(t.dtype == dtype, "tensor \"", t.name, "\": dtype ", dtype_name(t.dtype), ", expected ",
              dtype_name(dtype));
  NVFP4_CHECK(t.shape == shape, "tensor \"", t.name, "\": shape ", shape_text(t.shape), ", expected ",
              shape_text(shape));
}

// Block-scale bytes are UE4M3: 0x7F/0xFF are NaN, the sign bit must be clear.
void check_block_scales(const TensorInfo& t) {
  for (uint64_t i = 0; i < t.nbytes; ++i) {
    const uint8_t b = t.data[i];
    NVFP4_CHECK((b & 0x7F) != 0x7F, "tensor \"", t.name, "\": block scale byte ", i, " is NaN (0x",
                std::hex, int(b), std::dec, ")");
    NVFP4_CHECK(b <= 0x80, "tensor \"", t.name, "\": block scale byte ", i, " is negative (0x", std::hex, int(b),
                std::dec, "); UE4M3 scales are non-negative");
  }
}

std::string prefix(int layer) { return "model.layers." + std::to_string(layer) + ".mlp."; }

void append(std::vector<uint8_t>& dst, const TensorInfo& t) { dst.insert(dst.end(), t.data, t.data + t.nbytes); }

std::vector<Bf16> to_bf16(const TensorInfo& t) {
  std::vector<Bf16> out(size_t(t.numel()));
  if (t.dtype == DType::BF16) {
    std::memcpy(out.data(), t.data, t.nbytes);
  } else {
    std::vector<float> f = t.to_f32();
    for (size_t i = 0; i < f.size(); ++i) out[i] = bf16_from_float(f[i]);
  }
  return out;
}

}  // namespace

float read_global_scale(const TensorInfo& t) {
  NVFP4_CHECK(t.dtype == DType::F32, "tensor \"", t.name, "\": dtype ", dtype_name(t.dtype),
              ", expected F32 (a global scale)");
  NVFP4_CHECK(t.shape.empty() || (t.shape.size() == 1 && t.shape[0] == 1), "tensor \"", t.name, "\": shape ",
              shape_text(t.shape), ", expected [] or [1] (a global scale)");
  float g;
  std::memcpy(&g, t.data, 4);
  NVFP4_CHECK(std::isfinite(g) && g > 0.0f, "tensor \"", t.name, "\": global scale is ", g,
              " (must be finite and > 0)");
  return g;
}

MoeWeights load_moe_layer(const ModelDir& dir, int layer, const LoadOptions& options) {
  MoeWeights w;
  MoeConfig& cfg = w.config;
  cfg = read_moe_config(dir, layer);
  const int64_t H = cfg.hidden, I = cfg.intermediate, E = cfg.experts;
  const int64_t first = options.first_expert;
  const int64_t count = options.expert_count < 0 ? E - first : options.expert_count;
  NVFP4_CHECK(first >= 0 && count >= 0 && first + count <= E, "load_moe_layer: experts [", first, ", ",
              first + count, ") outside [0, E=", E, ")");
  const std::string p = prefix(layer);

  // Routed experts.
  ExpertWeights& ex = w.experts;
  ex.count = count;
  ex.first_expert = first;
  ex.hidden = H;
  ex.intermediate = I;
  std::vector<float> l1_in, l2_in;
  bool l1_complete = true, l2_complete = true;
  for (int64_t e = first; e < first + count; ++e) {
    const std::string ep = p + "experts." + std::to_string(e) + ".";
    float in13 = 0.0f;
    bool have13 = false;
    for (const char* proj : {"gate_proj", "up_proj"}) {
      Nvfp4Names n(ep + proj);
      expect(dir.get(n.weight), DType::U8, {I, H / 2});
      expect(dir.get(n.weight_scale), DType::F8E4M3, {I, H / 16});
      check_block_scales(dir.get(n.weight_scale));
      append(ex.w13_codes, dir.get(n.weight));
      ex.w13_global.push_back(read_global_scale(dir.get(n.weight_scale_2)));
      if (dir.has(n.input_scale)) {
        in13 = std::max(in13, read_global_scale(dir.get(n.input_scale)));
        have13 = true;
      } else if (options.static_l1_input) {
        NVFP4_FAIL(dir.path(), ": static L1 input scale requested but tensor \"", n.input_scale, "\" is missing");
      }
    }
    // Scales after codes, in the same gate-then-up order.
    for (const char* proj : {"gate_proj", "up_proj"}) append(ex.w13_scales, dir.get(Nvfp4Names(ep + proj).weight_scale));
    if (have13) l1_in.push_back(in13);
    else l1_complete = false;

    Nvfp4Names d(ep + "down_proj");
    expect(dir.get(d.weight), DType::U8, {H, I / 2});
    expect(dir.get(d.weight_scale), DType::F8E4M3, {H, I / 16});
    check_block_scales(dir.get(d.weight_scale));
    append(ex.w2_codes, dir.get(d.weight));
    append(ex.w2_scales, dir.get(d.weight_scale));
    ex.w2_global.push_back(read_global_scale(dir.get(d.weight_scale_2)));
    if (dir.has(d.input_scale)) {
      l2_in.push_back(read_global_scale(dir.get(d.input_scale)));
    } else {
      NVFP4_CHECK(!options.static_l2_input, dir.path(), ": static L2 input scale requested but tensor \"",
                  d.input_scale, "\" is missing");
      l2_complete = false;
    }
  }
  if (l1_complete && count > 0) ex.w13_input_scale = std::move(l1_in);
  if (l2_complete && count > 0) ex.w2_input_scale = std::move(l2_in);
  cfg.l1_input = options.static_l1_input ? InputScaleMode::Static : InputScaleMode::Dynamic;
  cfg.l2_input = options.static_l2_input ? InputScaleMode::Static : InputScaleMode::Dynamic;
  ex.validate();

  // Router (all E experts: routing is global even on an expert-parallel rank).
  const TensorInfo& gate = dir.get(p + "gate.weight");
  NVFP4_CHECK(gate.dtype == DType::F32 || gate.dtype == DType::BF16 || gate.dtype == DType::F16,
              "tensor \"", gate.name, "\": dtype ", dtype_name(gate.dtype), ", expected BF16 or F32");
  NVFP4_CHECK(gate.shape == std::vector<int64_t>({E, H}), "tensor \"", gate.name, "\": shape ",
              shape_text(gate.shape), ", expected ", shape_text({E, H}));
  w.router.gate = gate.to_f32();
  const std::string bias_name = p + "gate.e_score_correction_bias";
  if (dir.has(bias_name)) {
    const TensorInfo& b = dir.get(bias_name);
    NVFP4_CHECK(b.dtype == DType::F32 || b.dtype == DType::BF16, "tensor \"", b.name, "\": dtype ",
                dtype_name(b.dtype), ", expected F32");
    NVFP4_CHECK(b.shape == std::vector<int64_t>({E}), "tensor \"", b.name, "\": shape ", shape_text(b.shape),
                ", expected ", shape_text({E}));
    w.router.bias = b.to_f32();
  } else {
    w.router.bias.assign(size_t(E), 0.0f);
  }
  if (cfg.hash_routed) {
    const TensorInfo& t = dir.get(p + "gate.tid2eid");
    NVFP4_CHECK(t.dtype == DType::I32 || t.dtype == DType::I64, "tensor \"", t.name, "\": dtype ",
                dtype_name(t.dtype), ", expected I32");
    NVFP4_CHECK(t.shape.size() == 2 && t.shape[1] == cfg.top_k, "tensor \"", t.name, "\": shape ",
                shape_text(t.shape), ", expected [vocab, top_k=", cfg.top_k, "]");
    w.router.vocab = t.shape[0];
    w.router.tid2eid.resize(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) {
      int64_t v;
      if (t.dtype == DType::I32) {
        int32_t x;
        std::memcpy(&x, t.data + 4 * i, 4);
        v = x;
      } else {
        std::memcpy(&v, t.data + 8 * i, 8);
      }
      NVFP4_CHECK(v >= 0 && v < E, "tensor \"", t.name, "\": entry ", i, " (token ", i / cfg.top_k,
                  ") is expert ", v, ", outside [0, E=", E, ")");
      w.router.tid2eid[size_t(i)] = int32_t(v);
    }
  }

  // Shared expert (BF16, unquantized).
  if (cfg.shared_experts > 0) {
    const std::string sp = p + "shared_experts.";
    const TensorInfo& g = dir.get(sp + "gate_proj.weight");
    NVFP4_CHECK(g.shape.size() == 2 && g.shape[1] == H, "tensor \"", g.name, "\": shape ", shape_text(g.shape),
                ", expected [Is, H=", H, "]");
    const int64_t Is = g.shape[0];
    for (const auto* t : {&g, &dir.get(sp + "up_proj.weight"), &dir.get(sp + "down_proj.weight")})
      NVFP4_CHECK(t->dtype == DType::BF16 || t->dtype == DType::F32, "tensor \"", t->name, "\": dtype ",
                  dtype_name(t->dtype), ", expected BF16");
    expect(dir.get(sp + "up_proj.weight"), dir.get(sp + "up_proj.weight").dtype, {Is, H});
    expect(dir.get(sp + "down_proj.weight"), dir.get(sp + "down_proj.weight").dtype, {H, Is});
    cfg.shared_intermediate = Is == I * cfg.shared_experts ? 0 : Is;
    w.shared.w1 = to_bf16(g);
    w.shared.w3 = to_bf16(dir.get(sp + "up_proj.weight"));
    w.shared.w2 = to_bf16(dir.get(sp + "down_proj.weight"));
    check_finite(w.shared.w1.data(), int64_t(w.shared.w1.size()), (sp + "gate_proj.weight").c_str());
    check_finite(w.shared.w3.data(), int64_t(w.shared.w3.size()), (sp + "up_proj.weight").c_str());
    check_finite(w.shared.w2.data(), int64_t(w.shared.w2.size()), (sp + "down_proj.weight").c_str());
  }
  cfg.validate();
  return w;
}

// ---- save ---------------------------------------------------------------------

namespace {

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

json::Value config_json_of(const MoeConfig& c, int layer) {
  using json::Value;
  Value j = Value::object();
  j.set("architectures", Value::array({Value::string("DeepseekV4ForCausalLM")}));
  j.set("model_type", Value::string("deepseek_v4"));
  j.set("hidden_size", Value::integer(c.hidden));
  j.set("moe_intermediate_size", Value::integer(c.intermediate));
  j.set("n_routed_experts", Value::integer(c.experts));
  j.set("num_experts_per_tok", Value::integer(c.top_k));
  j.set("n_shared_experts", Value::integer(c.shared_experts));
  j.set("routed_scaling_factor", Value::number(c.routed_scaling_factor));
  j.set("swiglu_limit", c.swiglu_limit ? Value::number(*c.swiglu_limit) : Value());
  const char* scoring = c.scoring == Scoring::Sigmoid ? "sigmoid" : c.scoring == Scoring::Softmax ? "softmax" : "sqrtsoftplus";
  j.set("scoring_func", Value::string(scoring));
  j.set("norm_topk_prob", Value::boolean(c.norm_topk_prob));
  j.set("num_hidden_layers", Value::integer(layer + 1));
  // Every layer up to this one is spelled out, so the num_hash_layers default
  // (3) cannot make a layer hash-routed by accident.
  Value types = Value::array();
  for (int l = 0; l <= layer; ++l) types.push(Value::string(l == layer && c.hash_routed ? "hash_moe" : "moe"));
  j.set("mlp_layer_types", std::move(types));
  j.set("quantization_config", Value::object({{"quant_method", Value::string("modelopt")},
                                              {"quant_algo", Value::string("NVFP4")},
                                              {"group_size", Value::integer(16)}}));
  return j;
}

}  // namespace

std::string hf_quant_config_text(const std::vector<std::string>& exclude_modules) {
  using json::Value;
  Value ex = Value::array();
  for (const auto& m : exclude_modules) ex.push(Value::string(m));
  Value j = Value::object(
      {{"producer", Value::object({{"name", Value::string("nvfp4moe")}, {"version", Value::string("0.1.0")}})},
       {"quantization", Value::object({{"quant_algo", Value::string("NVFP4")},
                                       {"group_size", Value::integer(16)},
                                       {"exclude_modules", std::move(ex)}})}});
  return json::dump(j, 2) + "\n";
}

void save_moe_layer(const std::string& dir, int layer, const MoeWeights& w) {
  const MoeConfig& c = w.config;
  const ExpertWeights& ex = w.experts;
  c.validate();
  ex.validate();
  NVFP4_CHECK(layer >= 0, "save_moe_layer: layer must be >= 0, got ", layer);
  NVFP4_CHECK(ex.hidden == c.hidden && ex.intermediate == c.intermediate, "save_moe_layer: experts hold H=",
              ex.hidden, " I=", ex.intermediate, " but the config says H=", c.hidden, " I=", c.intermediate);
  const int64_t H = c.hidden, I = c.intermediate, E = c.experts, Is = c.shared_inter();
  NVFP4_CHECK(ex.first_expert >= 0 && ex.first_expert + ex.count <= E, "save_moe_layer: experts [",
              ex.first_expert, ", ", ex.first_expert + ex.count, ") outside [0, E=", E, ")");
  NVFP4_CHECK(w.router.gate.size() == size_t(E * H), "save_moe_layer: router gate has ", w.router.gate.size(),
              " values, expected E*H=", E * H);
  NVFP4_CHECK(w.router.bias.empty() || w.router.bias.size() == size_t(E), "save_moe_layer: router bias has ",
              w.router.bias.size(), " values, expected E=", E);
  NVFP4_CHECK(!c.hash_routed || (w.router.vocab > 0 && w.router.tid2eid.size() == size_t(w.router.vocab * c.top_k)),
              "save_moe_layer: hash-routed layer needs tid2eid [vocab, k], got ", w.router.tid2eid.size(),
              " entries for vocab=", w.router.vocab);
  if (c.shared_experts > 0)
    NVFP4_CHECK(w.shared.w1.size() == size_t(Is * H) && w.shared.w3.size() == size_t(Is * H) &&
                    w.shared.w2.size() == size_t(H * Is),
                "save_moe_layer: shared expert sizes w1=", w.shared.w1.size(), " w3=", w.shared.w3.size(),
                " w2=", w.shared.w2.size(), ", expected ", Is * H, " each");

  const std::string p = prefix(layer);
  SafetensorsWriter st;
  const int64_t gate_codes = I * H / 2, gate_scales = I * H / 16;
  const int64_t down_codes = H * I / 2, down_scales = H * I / 16;
  for (int64_t l = 0; l < ex.count; ++l) {
    const std::string ep = p + "experts." + std::to_string(ex.first_expert + l) + ".";
    for (int j = 0; j < 2; ++j) {  // 0 = gate (rows 0..I-1 of w13), 1 = up
      Nvfp4Names n(ep + (j == 0 ? "gate_proj" : "up_proj"));
      st.add(n.weight, DType::U8, {I, H / 2}, ex.w13_codes.data() + (2 * l + j) * gate_codes);
      st.add(n.weight_scale, DType::F8E4M3, {I, H / 16}, ex.w13_scales.data() + (2 * l + j) * gate_scales);
      st.add_owned(n.weight_scale_2, DType::F32, {}, f32_bytes(ex.w13_global[size_t(2 * l + j)]));
      if (!ex.w13_input_scale.empty())
        st.add_owned(n.input_scale, DType::F32, {}, f32_bytes(ex.w13_input_scale[size_t(l)]));
    }
    Nvfp4Names d(ep + "down_proj");
    st.add(d.weight, DType::U8, {H, I / 2}, ex.w2_codes.data() + l * down_codes);
    st.add(d.weight_scale, DType::F8E4M3, {H, I / 16}, ex.w2_scales.data() + l * down_scales);
    st.add_owned(d.weight_scale_2, DType::F32, {}, f32_bytes(ex.w2_global[size_t(l)]));
    if (!ex.w2_input_scale.empty()) st.add_owned(d.input_scale, DType::F32, {}, f32_bytes(ex.w2_input_scale[size_t(l)]));
  }
  st.add(p + "gate.weight", DType::F32, {E, H}, w.router.gate.data());
  if (!w.router.bias.empty()) st.add(p + "gate.e_score_correction_bias", DType::F32, {E}, w.router.bias.data());
  if (c.hash_routed) st.add(p + "gate.tid2eid", DType::I32, {w.router.vocab, c.top_k}, w.router.tid2eid.data());
  if (c.shared_experts > 0) {
    st.add(p + "shared_experts.gate_proj.weight", DType::BF16, {Is, H}, w.shared.w1.data());
    st.add(p + "shared_experts.up_proj.weight", DType::BF16, {Is, H}, w.shared.w3.data());
    st.add(p + "shared_experts.down_proj.weight", DType::BF16, {H, Is}, w.shared.w2.data());
  }
  st.set_metadata("format", "pt");

  // A stale index would make readers ignore the model.safetensors written here.
  NVFP4_CHECK(!fileio::exists(fileio::join(dir, "model.safetensors.index.json")), "save_moe_layer: ", dir,
              " already holds a sharded checkpoint (model.safetensors.index.json); save into a new directory");
  fileio::make_directories(dir);
  st.write(fileio::join(dir, "model.safetensors"));
  fileio::write_file_atomic(fileio::join(dir, "config.json"), json::dump(config_json_of(c, layer), 2) + "\n");
  fileio::write_file_atomic(fileio::join(dir, "hf_quant_config.json"),
                            hf_quant_config_text({p + "gate", p + "shared_experts"}));
}

}  // namespace nvfp4moe
