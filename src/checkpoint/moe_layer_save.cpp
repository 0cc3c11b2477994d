// One DeepSeek-V4 MoE layer written as a checkpoint directory in either
// layout: model.safetensors, config.json and hf_quant_config.json.
//
// Global scales: each projection gets its own weight_scale_2 (ExpertWeights
// keeps gate's and up's apart). ModelOpt's DeepSeek-V4 export gives w1 and w3
// of an expert one shared value (the max of their amax), so weights read from
// it are written back with equal values; weights whose gate and up scales
// differ keep them, which is what their codes were quantized with.
#include <cstring>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/shared_expert_io.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe {

namespace {

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

void check_savable(int layer, const MoeWeights& w) {
  const MoeConfig& c = w.config;
  const ExpertWeights& ex = w.experts;
  c.validate();
  ex.validate();
  NVFP4_CHECK(layer >= 0, "save_moe_layer: layer must be >= 0, got ", layer);
  NVFP4_CHECK(ex.format == ExpertFormat::Nvfp4, "save_moe_layer: routed experts are ", expert_format_name(ex.format),
              "; the writer writes NVFP4 experts");
  NVFP4_CHECK(ex.hidden == c.hidden && ex.intermediate == c.intermediate, "save_moe_layer: experts hold H=",
              ex.hidden, " I=", ex.intermediate, " but the config says H=", c.hidden, " I=", c.intermediate);
  const int64_t H = c.hidden, E = c.experts;
  NVFP4_CHECK(ex.first_expert >= 0 && ex.first_expert + ex.count <= E, "save_moe_layer: experts [",
              ex.first_expert, ", ", ex.first_expert + ex.count, ") outside [0, E=", E, ")");
  NVFP4_CHECK(w.router.gate.size() == size_t(E * H), "save_moe_layer: router gate has ", w.router.gate.size(),
              " values, expected E*H=", E * H);
  NVFP4_CHECK(w.router.bias.empty() || w.router.bias.size() == size_t(E), "save_moe_layer: router bias has ",
              w.router.bias.size(), " values, expected E=", E);
  NVFP4_CHECK(!c.hash_routed || (w.router.vocab > 0 && w.router.tid2eid.size() == size_t(w.router.vocab * c.top_k)),
              "save_moe_layer: hash-routed layer needs tid2eid [vocab, k], got ", w.router.tid2eid.size(),
              " entries for vocab=", w.router.vocab);
  if (c.shared_experts > 0) w.shared.validate(H, c.shared_inter());
}

// The routed experts' NVFP4 tensors, global expert ids; `ex` must outlive st.write().
void append_experts(SafetensorsWriter& st, const MoeNames& names, const ExpertWeights& ex) {
  const int64_t H = ex.hidden, I = ex.intermediate;
  const int64_t gate_codes = I * H / 2, gate_scales = I * H / 16;
  const int64_t down_codes = H * I / 2, down_scales = H * I / 16;
  for (int64_t l = 0; l < ex.count; ++l) {
    const int64_t e = ex.first_expert + l;
    for (int j = 0; j < 2; ++j) {  // 0 = gate (rows 0..I-1 of w13), 1 = up
      const Nvfp4Names n(names.expert(e, j == 0 ? Proj::Gate : Proj::Up));
      st.add(n.weight, DType::U8, {I, H / 2}, ex.w13_codes.data() + (2 * l + j) * gate_codes);
      st.add(n.weight_scale, DType::F8E4M3, {I, H / 16}, ex.w13_scales.data() + (2 * l + j) * gate_scales);
      st.add_owned(n.weight_scale_2, DType::F32, {}, f32_bytes(ex.w13_global[size_t(2 * l + j)]));
      if (!ex.w13_input_scale.empty())
        st.add_owned(n.input_scale, DType::F32, {}, f32_bytes(ex.w13_input_scale[size_t(l)]));
    }
    const Nvfp4Names d(names.expert(e, Proj::Down));
    st.add(d.weight, DType::U8, {H, I / 2}, ex.w2_codes.data() + l * down_codes);
    st.add(d.weight_scale, DType::F8E4M3, {H, I / 16}, ex.w2_scales.data() + l * down_scales);
    st.add_owned(d.weight_scale_2, DType::F32, {}, f32_bytes(ex.w2_global[size_t(l)]));
    if (!ex.w2_input_scale.empty()) st.add_owned(d.input_scale, DType::F32, {}, f32_bytes(ex.w2_input_scale[size_t(l)]));
  }
}

// Router: gate F32 [E, H]; the selection bias F32 [E], not on a hash-routed
// layer (it routes by tid2eid alone, and the official files give its gate no
// bias); tid2eid I32 [vocab, k].
void append_router(SafetensorsWriter& st, const MoeNames& names, const MoeWeights& w) {
  const MoeConfig& c = w.config;
  st.add(names.router_weight(), DType::F32, {c.experts, c.hidden}, w.router.gate.data());
  if (!w.router.bias.empty() && !c.hash_routed) st.add(names.router_bias(), DType::F32, {c.experts}, w.router.bias.data());
  if (c.hash_routed) st.add(names.tid2eid(), DType::I32, {w.router.vocab, c.top_k}, w.router.tid2eid.data());
}

}  // namespace

void append_moe_layer(SafetensorsWriter& st, const MoeNames& names, const MoeWeights& w) {
  check_savable(names.block().index, w);
  append_experts(st, names, w.experts);
  append_router(st, names, w);
  if (w.config.shared_experts > 0) append_shared_expert(st, names, w.shared, w.config.hidden, w.config.shared_inter());
}

void save_moe_layer(const std::string& dir, int layer, const MoeWeights& w, const SaveOptions& options) {
  NVFP4_CHECK(layer >= 0, "save_moe_layer: layer must be >= 0, got ", layer);
  const MoeNames names(options.layout, MoeBlock{layer, false});
  SafetensorsWriter st;
  append_moe_layer(st, names, w);
  st.set_metadata("format", "pt");

  // A stale index would make readers ignore the model.safetensors written here.
  NVFP4_CHECK(!fileio::exists(fileio::join(dir, "model.safetensors.index.json")), "save_moe_layer: ", dir,
              " already holds a sharded checkpoint (model.safetensors.index.json); save into a new directory");
  fileio::output_directory_target(dir);
  // All three outputs are checked before the first is written.
  for (const char* name : {"model.safetensors", "config.json", "hf_quant_config.json"})
    fileio::output_file_target(fileio::join(dir, name));
  fileio::make_directories(dir);
  st.write(fileio::join(dir, "model.safetensors"));
  fileio::write_file_atomic(fileio::join(dir, "config.json"), moe_config_json(w.config, layer, options.layout));
  const std::string ffn = names.block_name() + (options.layout == CheckpointLayout::DeepSeek ? ".ffn." : ".mlp.");
  const std::string hq = options.layout == CheckpointLayout::DeepSeek
                             ? hf_quant_config_mixed_text({names.experts_module()}, deepseek_excluded_modules())
                             : hf_quant_config_text({ffn + "gate", ffn + "shared_experts"});
  fileio::write_file_atomic(fileio::join(dir, "hf_quant_config.json"), hq);
}

}  // namespace nvfp4moe
