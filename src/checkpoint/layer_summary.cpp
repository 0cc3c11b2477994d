// summarize_moe_layers: every MoE block of a checkpoint from one pass over
// the tensor names, the dtypes and shapes of the headers, the model config
// and the quantization manifest. Values read: 0-d global scales of NVFP4
// experts and the FP8 shared experts' tile scales (small), nothing else.
#include <array>
#include <map>
#include <set>

#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "checkpoint/shared_expert_io.hpp"
#include "checkpoint/weight_format.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {

void ValueRange::add(float v) {
  min = count ? std::min(min, v) : v;
  max = count ? std::max(max, v) : v;
  ++count;
}

namespace {

// What the names of one block hold.
struct BlockTensors {
  std::map<int64_t, std::array<bool, 3>> experts;  // id -> projections with a .weight
  std::array<bool, 3> shared{};                    // shared projections with a .weight
  bool gate = false, bias = false, tid2eid = false;
};

std::map<MoeBlock, BlockTensors> scan_blocks(const ModelDir& dir) {
  std::map<MoeBlock, BlockTensors> blocks;
  for (const std::string& name : dir.tensor_names()) {
    const std::optional<ParsedMoeName> p = parse_moe_name(name);
    if (!p) continue;
    BlockTensors& b = blocks[p->block];
    switch (p->kind) {
      case ParsedMoeName::Kind::Expert:
        b.experts[p->expert][int(p->proj)] |= p->suffix == "weight";
        break;
      case ParsedMoeName::Kind::SharedExpert: b.shared[int(p->proj)] |= p->suffix == "weight"; break;
      case ParsedMoeName::Kind::Router:
        b.gate |= p->suffix == "weight";
        b.bias |= p->suffix == "bias" || p->suffix == "e_score_correction_bias";
        b.tid2eid |= p->suffix == "tid2eid";
        break;
      case ParsedMoeName::Kind::Other: break;
    }
  }
  return blocks;
}

std::string joined(const std::set<std::string>& s) {
  std::string r;
  for (const std::string& x : s) r += (r.empty() ? "" : "+") + x;
  return r;
}

// An MXFP4 projection's dtypes and shapes from the headers alone: reading its
// UE8M0 bytes would touch ~1/16 of the model (DeepSeek-V4-Pro: tens of GB).
void check_mxfp4_shapes(const ModelDir& dir, const std::string& prefix, Proj p, const MoeConfig* cfg,
                        MoeLayerSummary& s) {
  const TensorInfo &w = dir.get(prefix + ".weight"), &sc = dir.get(prefix + ".scale");
  const bool f4 = w.dtype == DType::F4;
  if (w.shape.size() != 2) {
    s.problems.push_back("tensor \"" + w.name + "\": shape " + shape_text(w.shape) + ", expected 2-D");
    return;
  }
  const int64_t N = w.shape[0], K = f4 ? w.shape[1] : 2 * w.shape[1];
  if (cfg) {
    const int64_t n = p == Proj::Down ? cfg->hidden : cfg->intermediate;
    const int64_t k = p == Proj::Down ? cfg->intermediate : cfg->hidden;
    if (N != n || K != k)
      s.problems.push_back("tensor \"" + w.name + "\": shape " + shape_text(w.shape) + ", expected " +
                           shape_text({n, f4 ? k : k / 2}));
  }
  if (K % kMxfp4BlockSize != 0 || sc.shape != std::vector<int64_t>({N, K / kMxfp4BlockSize}))
    s.problems.push_back("tensor \"" + sc.name + "\": shape " + shape_text(sc.shape) + ", expected " +
                         shape_text({N, K / kMxfp4BlockSize}) + " (one UE8M0 scale per 32 elements)");
}

// The routed experts: formats, missing projections, shapes against the config,
// and the global scales of the NVFP4 ones.
void summarize_experts(const ModelDir& dir, const MoeNames& names, const BlockTensors& t, const MoeConfig* cfg,
                       bool read_values, MoeLayerSummary& s) {
  std::set<std::string> formats;
  for (const auto& [e, has] : t.experts)
    for (Proj p : kProjs) {
      const std::string prefix = names.expert(e, p);
      if (!has[int(p)]) {
        s.problems.push_back("missing tensor \"" + prefix + ".weight\" (expert " + std::to_string(e) + ")");
        continue;
      }
      const WeightFormat f = classify_weight(dir, prefix);
      formats.insert(weight_format_name(f));
      if (f == WeightFormat::Mxfp4) check_mxfp4_shapes(dir, prefix, p, cfg, s);
      if (f != WeightFormat::Nvfp4) continue;
      try {
        // The loader's checks but for the block-scale bytes (a whole model holds ~100 GB of them).
        std::optional<std::pair<int64_t, int64_t>> shape;
        if (cfg)
          shape = p == Proj::Down ? std::pair{cfg->hidden, cfg->intermediate} : std::pair{cfg->intermediate, cfg->hidden};
        const Nvfp4Weight w =
            read_nvfp4_weight(dir, prefix, shape, read_values ? Nvfp4Read::Scalars : Nvfp4Read::Headers);
        if (read_values) s.weight_scale_2.add(w.global_scale);
        if (read_values && w.input_scale) s.input_scale.add(*w.input_scale);
      } catch (const Error& err) {
        s.problems.push_back(err.what());
      }
    }
  s.routed_format = formats.size() > 1 ? "mixed (" + joined(formats) + ")" : formats.empty() ? "" : *formats.begin();
  if (cfg && int64_t(t.experts.size()) != cfg->experts)
    s.problems.push_back(names.experts_module() + ": " + std::to_string(t.experts.size()) +
                         " routed experts, the config says n_routed_experts = " + std::to_string(cfg->experts));
}

void summarize_shared(const ModelDir& dir, const MoeNames& names, const BlockTensors& t, bool read_values,
                      MoeLayerSummary& s) {
  if (!t.shared[0] && !t.shared[1] && !t.shared[2]) return;
  std::set<std::string> formats;
  for (Proj p : kProjs) {
    const std::string prefix = names.shared(p);
    const WeightFormat f = classify_weight(dir, prefix);
    std::string name = weight_format_name(f);
    if (f == WeightFormat::Missing) s.problems.push_back("missing tensor \"" + prefix + ".weight\"");
    if (f == WeightFormat::Fp8Block && read_values) {
      const TensorInfo& w = dir.get(prefix + ".weight");
      try {
        NVFP4_CHECK(w.shape.size() == 2, "tensor \"", w.name, "\": shape ", shape_text(w.shape), ", expected 2-D");
        const Fp8BlockScales b = read_block_scales(dir, prefix, w.shape[0], w.shape[1]);
        if (b.block != SharedExpertWeights::kFp8Tile) {  // "FP8 32x32"
          const std::string edge = std::to_string(b.block);
          name.append(" ").append(edge).append("x").append(edge);
        }
        for (float v : b.factors) s.shared_scale.add(v);
      } catch (const Error& err) {
        s.problems.push_back(err.what());
      }
    }
    formats.insert(name);
  }
  s.shared_format = formats.size() > 1 ? "mixed (" + joined(formats) + ")" : *formats.begin();
}

void check_router(const MoeNames& names, const BlockTensors& t, const MoeConfig* cfg, MoeLayerSummary& s) {
  s.router = !t.gate ? "" : t.tid2eid ? "hash" : "scored";
  s.bias = t.bias;
  if (!t.gate) s.problems.push_back("missing tensor \"" + names.router_weight() + "\"");
  if (cfg && cfg->hash_routed && !t.tid2eid)
    s.problems.push_back(names.label() + " is hash-routed per the config but has no \"" + names.tid2eid() + "\"");
  if (cfg && !cfg->hash_routed && t.tid2eid)
    s.problems.push_back(names.label() + " has \"" + names.tid2eid() + "\" but the config makes it score-routed");
}

void check_manifest(const ModelDir& dir, const MoeNames& names, MoeLayerSummary& s) {
  const QuantManifest& m = dir.quant_manifest();
  const std::string module = names.experts_module();
  s.manifest_algo = m.algo_of(module);
  const bool nvfp4 = s.routed_format == "NVFP4";
  if (nvfp4 && m.quant_algo == "MIXED_PRECISION" && s.manifest_algo.empty())
    s.problems.push_back("the quantization manifest does not list " + module + " (its experts are NVFP4)");
  if (!s.manifest_algo.empty() && !s.routed_format.empty() && s.manifest_algo != s.routed_format)
    s.problems.push_back("the quantization manifest gives " + module + " " + s.manifest_algo + " but its experts are " +
                         s.routed_format);
}

}  // namespace

std::vector<MoeLayerSummary> summarize_moe_layers(const ModelDir& dir, bool read_values) {
  std::vector<MoeLayerSummary> out;
  for (const auto& [block, t] : scan_blocks(dir)) {
    if (t.experts.empty() && !t.gate && !t.shared[0] && !t.shared[1] && !t.shared[2]) continue;
    MoeLayerSummary s;
    const MoeNames names(dir.layout(), block);
    s.block = names.block_name();
    s.index = block.index;
    s.mtp = block.mtp;
    s.experts = int64_t(t.experts.size());
    std::optional<MoeConfig> cfg;
    if (!dir.config_json().empty()) {
      try {
        cfg = read_moe_config(dir, block.index, block.mtp);
      } catch (const Error& err) {
        s.problems.push_back(err.what());
      }
    }
    summarize_experts(dir, names, t, cfg ? &*cfg : nullptr, read_values, s);
    summarize_shared(dir, names, t, read_values, s);
    check_router(names, t, cfg ? &*cfg : nullptr, s);
    check_manifest(dir, names, s);
    s.loadable = (s.routed_format == "NVFP4" || s.routed_format == "MXFP4") && s.problems.empty() && cfg.has_value() &&
                 (s.shared_format.empty() || s.shared_format == "BF16" || s.shared_format == "FP8" ||
                  s.shared_format == "FP8 32x32");
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace nvfp4moe
