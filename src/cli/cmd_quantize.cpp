// `nvfp4moe quantize` and `nvfp4moe dequantize`: a .safetensors file or a
// model directory (sharded too) to ModelOpt NVFP4 and back.
//
// quantize: every 2-D floating tensor whose name matches --include becomes
//   <prefix>.weight         U8      [N, K/2]   packed E2M1 codes
//   <prefix>.weight_scale   F8_E4M3 [N, K/16]  linear block scales
//   <prefix>.weight_scale_2 F32     []         per-tensor global scale g
// (quantize_matrix with ScaleScope::PerTensor, NaN/Inf an error); the rest is
// copied unchanged. weight_scale_2 is written as a 0-d tensor, as ModelOpt's
// exports hold it; the reader accepts [] and [1].
// dequantize: every such triple back to a BF16 <prefix>.weight [N, K]
// (docs/numerics.md §2: value(q) * e4m3(s) * g in FP32, then rounded to BF16).
// A triple is any prefix with a .weight_scale or .weight_scale_2; it is
// validated as the loader validates it (checkpoint/nvfp4_weight.hpp), so a
// NaN or negative block-scale byte or a missing member is an error.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <set>

#include "checkpoint/file_util.hpp"
#include "checkpoint/model_files.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "common/json.hpp"
#include "common/pattern.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe::cli {

namespace {

constexpr const char* kDefaultInclude = R"(mlp\.experts\.[0-9]+\.(gate|up|down)_proj\.weight$)";

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

// Quantizes one matched tensor into the writer.
void quantize_tensor(const TensorInfo& t, SafetensorsWriter& w) {
  NVFP4_CHECK(t.name.size() > 7 && t.name.compare(t.name.size() - 7, 7, ".weight") == 0, "tensor \"", t.name,
              "\" matches --include but does not end in \".weight\"");
  const std::string prefix = t.name.substr(0, t.name.size() - 7);
  const int64_t N = t.shape[0], K = t.shape[1];
  NVFP4_CHECK(K % 16 == 0, "tensor \"", t.name, "\": K=", K, " (shape [", N, ", ", K,
              "]) is not a multiple of 16, cannot quantize to NVFP4");
  Nvfp4Matrix m;
  if (t.dtype == DType::BF16) {
    std::vector<Bf16> x(size_t(N * K));
    std::memcpy(x.data(), t.data, t.nbytes);
    m = quantize_matrix(x.data(), N, K, ScaleScope::PerTensor, 1.0f, true, t.name.c_str());
  } else {
    std::vector<float> x = t.to_f32();
    if (t.dtype == DType::F64) check_finite(x.data(), int64_t(x.size()), t.name.c_str());  // f32 overflow -> Inf
    m = quantize_matrix(x.data(), N, K, ScaleScope::PerTensor, 1.0f, true, t.name.c_str());
  }
  Nvfp4Names n(prefix);
  w.add_owned(n.weight, DType::U8, {N, K / 2}, std::move(m.codes));
  w.add_owned(n.weight_scale, DType::F8E4M3, {N, K / 16}, std::move(m.scales));
  w.add_owned(n.weight_scale_2, DType::F32, {}, f32_bytes(m.global_scale[0]));
}

std::string add_quantization_config(const std::string& config_json) {
  if (config_json.empty()) return "";
  json::Value c = json::parse(config_json, "config.json");
  NVFP4_CHECK(c.is_object(), "config.json must hold a JSON object");
  c.set("quantization_config", json::Value::object({{"quant_method", json::Value::string("modelopt")},
                                                    {"quant_algo", json::Value::string("NVFP4")},
                                                    {"group_size", json::Value::integer(16)}}));
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
      "usage: nvfp4moe quantize --in IN --out OUT [--include REGEX]\n"
      "  IN, OUT: both .safetensors files or both model directories (shards kept).\n"
      "  2-D floating tensors whose name REGEX matches anywhere become ModelOpt NVFP4\n"
      "  (weight, weight_scale, weight_scale_2); default REGEX: %s\n"
      "  REGEX: literals, \\x for a non-alphanumeric x, \\d \\w \\s (\\D \\W \\S), ., [a-z] [^...],\n"
      "  * + ?, |, ( ) and (?: ), ^ $ (an ECMAScript subset, matched in linear time).\n",
      kDefaultInclude);
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  const Args args(argc, argv, {flag("help"), text("in"), text("out"), text("include")});
  if (args.has("help")) {
    print_usage_quantize();
    return 0;
  }
  const std::string in = args.require("in"), out = args.require("out");
  const Pattern include(args.get("include", kDefaultInclude), "--include");

  Progress progress("quantize");
  std::set<std::string> quantized_layers;
  RewriteSpec spec;
  spec.transform = [&](const SafetensorsFile& src, SafetensorsWriter& w) {
    progress.set_total(src.tensors().size());
    for (const auto& t : src.tensors()) {
      if (include.search(t.name) && t.shape.size() == 2 && is_float_dtype(t.dtype)) {
        quantize_tensor(t, w);
      } else {
        w.add(t.name, t.dtype, t.shape, t.data);
      }
      progress.tick(base_name(src.path()));
    }
  };
  spec.config_edit = add_quantization_config;
  // Modules left unquantized: the linear weights that did not match.
  std::vector<std::string> excluded;
  if (fileio::is_directory(in)) {
    ModelDir md(in);
    for (const auto& name : md.tensor_names()) {
      const TensorInfo& t = md.get(name);
      if (t.shape.size() == 2 && is_float_dtype(t.dtype) && name.size() > 7 &&
          name.compare(name.size() - 7, 7, ".weight") == 0 && !include.search(name))
        excluded.push_back(name.substr(0, name.size() - 7));
    }
    spec.extra_files.push_back({"hf_quant_config.json", hf_quant_config_text(excluded)});
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
