// `nvfp4moe quantize` and `nvfp4moe dequantize`: a .safetensors file or a
// model directory (sharded too) to ModelOpt NVFP4 and back.
//
// quantize: every 2-D floating tensor whose name matches --include becomes
//   <prefix>.weight         U8      [N, K/2]   packed E2M1 codes
//   <prefix>.weight_scale   F8_E4M3 [N, K/16]  linear block scales
//   <prefix>.weight_scale_2 F32     []         global scale g
// (docs/numerics.md §2, NaN/Inf an error); the rest is copied unchanged, and
// the names keep the layout they were given (DeepSeek's layers.L.ffn.* or
// Hugging Face's model.layers.L.mlp.*; the default --include is that
// layout's routed experts). g = amax / (6 * 448) of the tensor, except that
// an expert's gate and up, when both are quantized, share g of the larger
// amax, as ModelOpt writes them in both layouts. weight_scale_2 is written as
// a 0-d tensor, as ModelOpt's exports hold it; the reader accepts [] and [1].
// dequantize: every such triple back to a BF16 <prefix>.weight [N, K]
// (docs/numerics.md §2: value(q) * e4m3(s) * g in FP32, then rounded to BF16).
// A triple is any prefix with a .weight_scale or .weight_scale_2; it is
// validated as the loader validates it (checkpoint/nvfp4_weight.hpp), so a
// NaN or negative block-scale byte or a missing member is an error.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <cstring>
#include <map>
#include <optional>
#include <set>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "common/json.hpp"
#include "common/pattern.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

#ifdef NVFP4MOE_HAS_CUDA
#include "cuda/backend/device_quantizer.hpp"
#endif

namespace nvfp4moe::cli {

namespace {

// The routed-expert weights of each layout (docs/checkpoints.md): Hugging
// Face's names, and DeepSeek's main layers as ModelOpt's DeepSeek-V4 export
// selects them (its MTP experts stay in their source format).
constexpr const char* kDefaultIncludeHuggingFace = R"(mlp\.experts\.[0-9]+\.(gate|up|down)_proj\.weight$)";
constexpr const char* kDefaultIncludeDeepSeek = R"(^layers\.[0-9]+\.ffn\.experts\.[0-9]+\.w[123]\.weight$)";

const char* default_include(CheckpointLayout layout) {
  return layout == CheckpointLayout::DeepSeek ? kDefaultIncludeDeepSeek : kDefaultIncludeHuggingFace;
}

// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(const char* what) : what_(what), tty_(::isatty(2) != 0) {}
  ~Progress() {
    if (tty_ && drawn_) std::fputc('\n', stderr);
  }
  void set_total(size_t n) {
    total_ = n;
    done_ = 0;
  }
  void tick(const std::string& file) {
    ++done_;
    if (!tty_ || total_ == 0) return;
    const int width = 30, filled = int(width * done_ / total_);
    std::fprintf(stderr, "\r%s %s [%.*s%*s] %zu/%zu", what_, file.c_str(), filled,
                 "##############################", width - filled, "", done_, total_);
    std::fflush(stderr);
    drawn_ = true;
  }

 private:
  const char* what_;
  bool tty_, drawn_ = false;
  size_t total_ = 0, done_ = 0;
};

bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F64; }

std::vector<uint8_t> f32_bytes(float v) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &v, 4);
  return b;
}

std::string base_name(const std::string& path) {
  auto s = path.find_last_of('/');
  return s == std::string::npos ? path : path.substr(s + 1);
}

bool ends_with_weight(const std::string& name) {
  return name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
}

// max |x| of a tensor; NaN or Inf is an error naming it and the index.
float amax_of(const TensorInfo& t) {
  const int64_t n = t.shape[0] * t.shape[1];
  float m = 0.0f;
  if (t.dtype == DType::BF16) {
    std::vector<Bf16> x(static_cast<size_t>(n));
    std::memcpy(x.data(), t.data, t.nbytes);
    check_finite(x.data(), n, t.name.c_str());
    for (const Bf16& v : x) m = std::max(m, std::fabs(bf16_to_float(v)));
  } else {
    const std::vector<float> x = t.to_f32();
    check_finite(x.data(), n, t.name.c_str());  // F64 beyond the F32 range becomes Inf: refused
    for (float v : x) m = std::max(m, std::fabs(v));
  }
  return m;
}

// The routed-expert fields of a name, or nullopt. quantize matches names as
// text (any length, any digits); a name whose index no loader could address
// (out of range, a leading zero) is simply not an expert here.
std::optional<ParsedMoeName> expert_name(const std::string& name) {
  try {
    std::optional<ParsedMoeName> p = parse_moe_name(name);
    if (p && p->kind == ParsedMoeName::Kind::Expert) return p;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// Which tensors become NVFP4 and the global scale of each. An expert's gate
// and up (w1 / w3, gate_proj / up_proj) that are both quantized get one g
// from the larger of their amaxes, as both of ModelOpt's exports write them:
// the DeepSeek-V4 script fuses the w1 / w3 amaxes by max ("one fused GEMM1
// scale"), and the Hugging Face export's requantize_resmooth_fused_llm_layers
// gives linears that share an input (an expert's gate_proj and up_proj,
// experts.N matched by name too) the max weight amax in
// preprocess_linear_fusion. Every other weight gets its own g. Pairs are
// found across shards.
// Where quantize's arithmetic runs: the host's quantize_matrix, or a GPU
// (cuda/backend/device_quantizer.hpp) with the same bytes.
struct Quantizer {
  std::function<float(const TensorInfo&)> amax;
  std::function<Nvfp4Matrix(const TensorInfo&, float)> quantize;
};

Nvfp4Matrix quantize_on_host(const TensorInfo& t, float g) {
  const int64_t N = t.shape[0], K = t.shape[1];
  if (t.dtype == DType::BF16) {
    std::vector<Bf16> x(size_t(N * K));
    std::memcpy(x.data(), t.data, t.nbytes);
    return quantize_matrix(x.data(), N, K, ScaleScope::Static, g, true, t.name.c_str());
  }
  std::vector<float> x = t.to_f32();
  if (t.dtype == DType::F64) check_finite(x.data(), int64_t(x.size()), t.name.c_str());  // f32 overflow -> Inf
  return quantize_matrix(x.data(), N, K, ScaleScope::Static, g, true, t.name.c_str());
}

Quantizer make_quantizer(const std::string& device) {
  if (device == "cpu") return {amax_of, quantize_on_host};
#ifdef NVFP4MOE_HAS_CUDA
  auto q = std::make_shared<cuda::DeviceQuantizer>(0);
  return {[q](const TensorInfo& t) { return q->amax(t); },
          [q](const TensorInfo& t, float g) { return q->quantize(t, g); }};
#else
  NVFP4_FAIL("--device cuda: this build of nvfp4moe has no CUDA backend (nvcc was not found at configure time)");
#endif
}

class QuantizePlan {
 public:
  QuantizePlan(const ModelDir& md, const Pattern& include, const Quantizer& q)
      : md_(md), include_(include), quantizer_(q) {}

  bool quantized(const TensorInfo& t) const {
    return include_.search(t.name) && t.shape.size() == 2 && is_float_dtype(t.dtype);
  }

  float global_scale(const TensorInfo& t) {
    float a = amax(t);
    if (const std::optional<std::string> s = gate_up_sibling(t.name); s && md_.has(*s) && quantized(md_.get(*s)))
      a = std::max(a, amax(md_.get(*s)));
    return global_scale_for_amax(a);
  }

  // The manifest's module of a quantized tensor: an expert's "<ffn>experts"
  // (as ModelOpt keys quantized_layers), else the tensor's own module.
  static std::string module_of(const std::string& name) {
    if (const std::optional<ParsedMoeName> p = expert_name(name)) return MoeNames(p->layout, p->block).experts_module();
    return name.substr(0, name.size() - 7);
  }

 private:
  static std::optional<std::string> gate_up_sibling(const std::string& name) {
    const std::optional<ParsedMoeName> p = expert_name(name);
    if (!p || p->suffix != "weight" || p->proj == Proj::Down)
      return std::nullopt;
    return MoeNames(p->layout, p->block).expert(p->expert, p->proj == Proj::Gate ? Proj::Up : Proj::Gate) + ".weight";
  }
  float amax(const TensorInfo& t) {
    auto it = amax_.find(t.name);
    if (it == amax_.end()) it = amax_.emplace(t.name, quantizer_.amax(t)).first;
    return it->second;
  }

  const ModelDir& md_;
  const Pattern& include_;
  const Quantizer& quantizer_;
  std::map<std::string, float> amax_;
};

// Quantizes one matched tensor under global scale g into the writer.
void quantize_tensor(const TensorInfo& t, float g, const Quantizer& q, SafetensorsWriter& w) {
  NVFP4_CHECK(ends_with_weight(t.name), "tensor \"", t.name, "\" matches --include but does not end in \".weight\"");
  const std::string prefix = t.name.substr(0, t.name.size() - 7);
  const int64_t N = t.shape[0], K = t.shape[1];
  NVFP4_CHECK(K % 16 == 0, "tensor \"", t.name, "\": K=", K, " (shape [", N, ", ", K,
              "]) is not a multiple of 16, cannot quantize to NVFP4");
  Nvfp4Matrix m = q.quantize(t, g);
  Nvfp4Names n(prefix);
  w.add_owned(n.weight, DType::U8, {N, K / 2}, std::move(m.codes));
  w.add_owned(n.weight_scale, DType::F8E4M3, {N, K / 16}, std::move(m.scales));
  w.add_owned(n.weight_scale_2, DType::F32, {}, f32_bytes(g));
}

// config.json with the quantization_config of the layout's producer:
// Hugging Face: ModelOpt's HF export form (nvfp4_weight_only_quantization_config);
// DeepSeek: the source's quantization_config (DeepSeek's FP8 one, if any)
// with the NVFP4 experts added as ModelOpt's DeepSeek-V4 export adds them
// (moe_quant_algo, the MIXED_PRECISION manifest, the exclusions as "ignore").
std::string add_quantization_config(const std::string& config_json, CheckpointLayout layout,
                                    const json::Value& mixed_manifest, const std::vector<std::string>& excluded) {
  if (config_json.empty()) return "";
  json::Value c = json::parse(config_json, "config.json");
  NVFP4_CHECK(c.is_object(), "config.json must hold a JSON object");
  if (layout == CheckpointLayout::HuggingFace) {
    c.set("quantization_config", nvfp4_weight_only_quantization_config(excluded));
    return json::dump(c, 2) + "\n";
  }
  const json::Value* q0 = c.find("quantization_config");
  json::Value q = q0 && q0->is_object() ? *q0 : json::Value::object();
  if (!q.find("quant_method")) q.set("quant_method", json::Value::string("modelopt"));
  q.set("moe_quant_algo", json::Value::string("NVFP4"));
  for (const char* k : {"quant_algo", "kv_cache_quant_algo", "group_size", "quantized_layers"})
    q.set(k, *mixed_manifest.find(k));
  q.set("ignore", *mixed_manifest.find("exclude_modules"));
  c.set("quantization_config", std::move(q));
  return json::dump(c, 2) + "\n";
}

std::string drop_quantization_config(const std::string& config_json) {
  if (config_json.empty()) return "";
  json::Value c = json::parse(config_json, "config.json");
  NVFP4_CHECK(c.is_object(), "config.json must hold a JSON object");
  json::Value out = json::Value::object();
  for (const auto& [k, v] : c.members())
    if (k != "quantization_config") out.set(k, v);
  return json::dump(out, 2) + "\n";
}

void print_usage_quantize() {
  std::printf(
      "usage: nvfp4moe quantize --in IN --out OUT [--include REGEX] [--device cpu|cuda]\n"
      "  IN, OUT: both .safetensors files or both model directories (shards kept).\n"
      "  2-D floating tensors whose name REGEX matches anywhere become ModelOpt NVFP4\n"
      "  (weight, weight_scale, weight_scale_2) under the names they had; an expert's\n"
      "  gate and up share one weight_scale_2 (the larger amax). Default REGEX, the\n"
      "  routed experts of the input's layout:\n"
      "    Hugging Face: %s\n"
      "    DeepSeek:     %s\n"
      "  REGEX: literals, \\x for a non-alphanumeric x, \\d \\w \\s (\\D \\W \\S), ., [a-z] [^...],\n"
      "  * + ?, |, ( ) and (?: ), ^ $ (an ECMAScript subset, matched in linear time).\n"
      "  --device cuda: amaxes and quantization on the GPU (the same bytes as on the host); a\n"
      "  progress bar on stderr when it is a terminal.\n",
      kDefaultIncludeHuggingFace, kDefaultIncludeDeepSeek);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  const Args args(argc, argv,
                  {flag("help"), text("in"), text("out"), text("include"), choice("device", {"cpu", "cuda"})});
  if (args.has("help")) {
    print_usage_quantize();
    return 0;
  }
  const std::string in = args.require("in"), out = args.require("out");
  std::optional<Pattern> include;  // a pattern given is checked before the input is opened
  if (args.has("include")) include.emplace(args.get("include", ""), "--include");
  NVFP4_CHECK(fileio::exists(in), in, ": no such file or directory");
  const ModelDir md(in);  // headers only; the layout decides the default pattern and the manifests
  const CheckpointLayout layout = md.layout();
  if (!include) include.emplace(default_include(layout), "--include");
  const Quantizer quantizer = make_quantizer(args.get("device", "cpu"));
  QuantizePlan plan(md, *include, quantizer);

  Progress progress("quantize");
  RewriteSpec spec;
  spec.transform = [&](const SafetensorsFile& src, SafetensorsWriter& w) {
    progress.set_total(src.tensors().size());
    for (const auto& t : src.tensors()) {
      if (plan.quantized(t)) {
        quantize_tensor(t, plan.global_scale(t), quantizer, w);
      } else {
        w.add(t.name, t.dtype, t.shape, t.data);
      }
      progress.tick(base_name(src.path()));
    }
  };
  if (fileio::is_directory(in)) {
    // Modules left unquantized: the linear weights that did not match.
    std::vector<std::string> excluded;
    std::set<std::string> modules;
    for (const auto& name : md.tensor_names()) {
      const TensorInfo& t = md.get(name);
      if (plan.quantized(t)) modules.insert(QuantizePlan::module_of(name));
      else if (t.shape.size() == 2 && is_float_dtype(t.dtype) && ends_with_weight(name))
        excluded.push_back(name.substr(0, name.size() - 7));
    }
    const json::Value mixed = mixed_precision_manifest({modules.begin(), modules.end()}, excluded);
    spec.config_edit = [&, mixed](const std::string& text) {
      return add_quantization_config(text, layout, mixed, excluded);
    };
    spec.extra_files.push_back({"hf_quant_config.json", layout == CheckpointLayout::DeepSeek
                                                            ? hf_quant_config_mixed_text({modules.begin(), modules.end()}, excluded)
                                                            : hf_quant_config_text(excluded)});
    rewrite_checkpoint(in, out, spec);
    return 0;
  }
  rewrite_checkpoint(in, out, spec);
  return 0;
}

int cmd_dequantize(int argc, char** argv) {
  const Args args(argc, argv, {flag("help"), text("in"), text("out")});
  if (args.has("help")) {
    std::printf("usage: nvfp4moe dequantize --in IN --out OUT\n"
                "  Every ModelOpt NVFP4 triple (weight, weight_scale, weight_scale_2) becomes a BF16 weight.\n");
    return 0;
  }
  const std::string in = args.require("in"), out = args.require("out");
  Progress progress("dequantize");
  RewriteSpec spec;
  spec.transform = [&](const SafetensorsFile& src, SafetensorsWriter& w) {
    progress.set_total(src.tensors().size());
    std::set<std::string> prefixes, consumed;
    for (const auto& t : src.tensors())
      for (const std::string suffix : {".weight_scale", ".weight_scale_2"})
        if (t.name.size() > suffix.size() &&
            t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0)
          prefixes.insert(t.name.substr(0, t.name.size() - suffix.size()));
    for (const std::string& prefix : prefixes) {
      const Nvfp4Names n(prefix);
      const Nvfp4Weight q = read_nvfp4_weight(src, prefix, std::nullopt, Nvfp4Read::Everything);
      const int64_t N = q.rows, K = q.cols;
      std::vector<Bf16> x(size_t(N * K));
      dequantize_rows(q.codes->data, q.scales->data, &q.global_scale, 0, N, K, x.data());
      std::vector<uint8_t> bytes(x.size() * 2);
      std::memcpy(bytes.data(), x.data(), bytes.size());
      w.add_owned(n.weight, DType::BF16, {N, K}, std::move(bytes));
      consumed.insert({n.weight, n.weight_scale, n.weight_scale_2, n.input_scale});
    }
    for (const auto& t : src.tensors()) {
      if (!consumed.count(t.name)) w.add(t.name, t.dtype, t.shape, t.data);
      progress.tick(base_name(src.path()));
    }
  };
  spec.config_edit = drop_quantization_config;
  spec.drop_files = {"hf_quant_config.json"};
  rewrite_checkpoint(in, out, spec);
  return 0;
}

}  // namespace nvfp4moe::cli
