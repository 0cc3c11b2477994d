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
// Each file goes through quantize_pipeline.hpp: reading, the arithmetic (host
// or GPU) and writing overlap, the output's header first and every tensor
// written at its offset once done.
// dequantize: every such triple back to a BF16 <prefix>.weight [N, K]
// (docs/numerics.md §2: value(q) * e4m3(s) * g in FP32, then rounded to BF16).
// A triple is any prefix with a .weight_scale or .weight_scale_2; it is
// validated as the loader validates it (checkpoint/nvfp4_weight.hpp), so a
// NaN or negative block-scale byte or a missing member is an error.

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <map>
#include <optional>
#include <set>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "checkpoint/moe_names.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "cli/quantize_pipeline.hpp"
#include "common/json.hpp"
#include "common/pattern.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

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

std::string base_name(const std::string& path) {
  auto s = path.find_last_of('/');
  return s == std::string::npos ? path : path.substr(s + 1);
}

// --timing: where the time went, on stderr, one "timing:" line per phase.
// A stage's busy time is its own work (compute's includes waiting for the
// upload and the amaxes; write's, waiting for the download); its waiting is
// for the stage before it (read: for a free slot, i.e. the stages after).
// The stage that never waits bounds the rate.
void print_timing(const QuantizeTimes& t, QuantizeEngine& engine, double setup_ms, double wall_ms) {
  const double gb_in = double(t.bytes_in) / 1e9, gb_out = double(t.bytes_out) / 1e9;
  auto rate = [](double gb, double ms) { return ms > 0 ? gb / ms * 1e3 : 0.0; };
  std::fprintf(stderr, "timing: setup %.1f ms (the device, the input's headers)\n", setup_ms);
  std::fprintf(stderr, "timing: read %.1f ms busy (%.2f GB/s of input), %.1f ms waiting for a free slot\n",
               t.read.busy_ms, rate(gb_in, t.read.busy_ms), t.read.wait_ms);
  std::fprintf(stderr, "timing: compute %.1f ms busy (amaxes awaited, quantization queued), %.1f ms waiting for reads\n",
               t.compute.busy_ms, t.compute.wait_ms);
  std::fprintf(stderr,
               "timing: write %.1f ms writing (%.2f GB/s of output), %.1f ms waiting for results, %.1f ms waiting "
               "for the compute stage\n",
               t.write_io_ms, rate(gb_out, t.write_io_ms), t.write.busy_ms - t.write_io_ms, t.write.wait_ms);
  std::fputs(engine.timing().c_str(), stderr);
  std::fprintf(stderr,
               "timing: pipelines %.1f ms for %.2f GB in, %.2f GB out, %lld groups; commit and the rest %.1f ms; "
               "wall %.1f ms (%.2f GB/s of input)\n",
               t.pipeline_ms, gb_in, gb_out, (long long)t.groups, wall_ms - setup_ms - t.pipeline_ms, wall_ms,
               rate(gb_in, wall_ms));
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
      "usage: nvfp4moe quantize --in IN --out OUT [--include REGEX] [--device cpu|cuda] [--timing]\n"
      "  IN, OUT: both .safetensors files or both model directories (shards kept).\n"
      "  2-D floating tensors whose name REGEX matches anywhere become ModelOpt NVFP4\n"
      "  (weight, weight_scale, weight_scale_2) under the names they had; an expert's\n"
      "  gate and up share one weight_scale_2 (the larger amax). Default REGEX, the\n"
      "  routed experts of the input's layout:\n"
      "    Hugging Face: %s\n"
      "    DeepSeek:     %s\n"
      "  REGEX: literals, \\x for a non-alphanumeric x, \\d \\w \\s (\\D \\W \\S), ., [a-z] [^...],\n"
      "  * + ?, |, ( ) and (?: ), ^ $ (an ECMAScript subset, matched in linear time).\n"
      "  --device cuda: amaxes and quantization on the GPU (the same bytes as on the host).\n"
      "  Reading, quantizing and writing overlap: each file's output header goes first, every\n"
      "  tensor is written at its offset as it is done. A progress bar on stderr when it is a\n"
      "  terminal; --timing prints where the time went (stderr, \"timing:\" lines).\n",
      kDefaultIncludeHuggingFace, kDefaultIncludeDeepSeek);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  const auto t0 = std::chrono::steady_clock::now();
  const Args args(argc, argv, {flag("help"), text("in"), text("out"), text("include"),
                               choice("device", {"cpu", "cuda"}), flag("timing")});
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
  const bool timing = args.has("timing");
  const std::unique_ptr<QuantizeEngine> engine = make_quantize_engine(args.get("device", "cpu"), timing);
  QuantizePlan plan(md, *include);

  Progress progress("quantize");
  QuantizeTimes times;
  RewriteSpec spec;
  spec.transform = [&](const SafetensorsFile& src, SafetensorsWriter& w) {
    progress.set_total(src.tensors().size());
    add_quantized_file(src, w, plan, *engine, [&progress, name = base_name(src.path())] { progress.tick(name); },
                       times);
  };
  // Modules left unquantized: the linear weights that did not match.
  std::vector<std::string> excluded;
  std::set<std::string> modules;
  if (fileio::is_directory(in)) {
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
  }
  const double setup_ms = ms_since(t0);
  rewrite_checkpoint(in, out, spec);
  if (timing) print_timing(times, *engine, setup_ms, ms_since(t0));
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
