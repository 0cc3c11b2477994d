// `nvfp4moe convert --to nvfp4 IN OUT`: DeepSeek's MXFP4 release to an
// NVFP4-expert checkpoint as NVIDIA ModelOpt writes it (src/checkpoint/convert.hpp).
#include <cstdio>
#include <optional>
#include <string>

#include "checkpoint/convert.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/progress.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

#ifdef NVFP4MOE_HAS_CUDA
#include <memory>

#include "cuda/backend/device_quantizer.hpp"
#endif

namespace nvfp4moe::cli {

namespace {

void print_usage() {
  std::printf(
      "usage: nvfp4moe convert --to nvfp4 IN OUT [--lossless] [--include-mtp] [--amax AMAX.safetensors]\n"
      "                        [--threads N] [--device cpu|cuda] [--workers N]\n"
      "IN: DeepSeek's MXFP4 release (shards + index, official names); OUT: a new directory with the same\n"
      "shards where every routed-expert weight layers.L.ffn.experts.E.w1|w2|w3 is NVFP4 (weight,\n"
      "weight_scale, weight_scale_2 [, input_scale]) and every other tensor is copied byte for byte;\n"
      "index, config.json and hf_quant_config.json as ModelOpt's quantize_to_nvfp4.py writes them.\n"
      "Default: MXFP4 -> BF16 -> NVFP4 with weight_scale_2 = amax / 2688 (w1 and w3: the larger amax).\n"
      "--lossless: ModelOpt's closed-form cast, weight_scale_2 = 2^(k_max - 8): blocks within E4M3's\n"
      "range keep their values exactly; the others are requantized and listed.\n"
      "--include-mtp: convert the mtp.* experts too (ModelOpt leaves them MXFP4).\n"
      "--amax: calibration amaxes, F32 scalars named as ModelOpt dumps them\n"
      "(<block>.ffn.experts.<e>.<wN>_{weight,input}_quantizer._amax); input_scale is written only then.\n"
      "--device cuda: MXFP4 decode, amaxes, NVFP4 quantization and the lossless cast on the GPU (the same\n"
      "bytes as on the host); --workers N (default 4) expert weights at once, each on its own stream.\n");
}

// --device cuda: expert weights converted at once by default, each worker
// with its own quantizer (bench/convert_bench.cpp measures 1 against 4).
constexpr int kGpuWorkers = 4;

// Where the numerics run: the host's (--threads), or the GPU's.
std::optional<ConvertNumerics> make_numerics(const std::string& device) {
  if (device == "cpu") return std::nullopt;
#ifdef NVFP4MOE_HAS_CUDA
  return cuda::device_convert_numerics(std::make_shared<cuda::DeviceQuantizer>(0));
#else
  NVFP4_FAIL("--device cuda: this build of nvfp4moe has no CUDA backend (nvcc was not found at configure time)");
#endif
}

}  // namespace

int cmd_convert(int argc, char** argv) {
  const Args args(argc, argv,
                  {flag("help"), choice("to", {"nvfp4"}), flag("lossless"), flag("include-mtp"), text("amax"),
                   integer("threads", 1, kMaxThreads), choice("device", {"cpu", "cuda"}), integer("workers", 1, 64)},
                  2);
  if (args.has("help")) {
    print_usage();
    return 0;
  }
  args.require("to");
  NVFP4_CHECK(args.positional().size() == 2, "convert takes IN and OUT, got ", args.positional().size(),
              " positional arguments");
  const std::string& in = args.positional()[0];
  const std::string& out = args.positional()[1];
  ConvertOptions o;
  o.lossless = args.has("lossless");
  o.include_mtp = args.has("include-mtp");
  o.threads = int(args.get_int("threads", 0));  // 0: every core
  o.numerics = make_numerics(args.get("device", "cpu"));  // before any output: no GPU is an error here
#ifdef NVFP4MOE_HAS_CUDA
  if (o.numerics) {  // the GPU: several workers, each with its own quantizer (stream, buffers)
    o.make_numerics = [] { return cuda::device_convert_numerics(std::make_shared<cuda::DeviceQuantizer>(0)); };
    o.workers = int(args.get_int("workers", kGpuWorkers));
  }
#endif
  if (const auto amax = args.value("amax")) {
    const SafetensorsFile f(*amax);
    for (const TensorInfo& t : f.tensors()) {
      NVFP4_CHECK(t.dtype == DType::F32 && t.numel() == 1, *amax, ": tensor \"", t.name, "\" is ",
                  dtype_name(t.dtype), " with ", t.numel(), " elements, expected one F32 amax");
      o.amax[t.name] = t.to_f32()[0];
    }
  }
  Progress bar("convert");  // a bar of expert weights on a terminal, with the shard lines above it
  o.progress = [&bar](const std::string& line) { bar.say(line); };
  o.weight_done = [&bar](int64_t done, int64_t total, const std::string& shard) {
    bar.show(size_t(done), size_t(total), shard);
  };
  const ConvertReport r = convert_mxfp4_to_nvfp4(in, out, o);
  bar.finish();
  std::printf("%s -> %s: %lld expert weights to NVFP4, %lld tensors passed through, %lld shards\n", in.c_str(),
              out.c_str(), (long long)r.experts_converted, (long long)r.tensors_passed, (long long)r.shards);
  if (o.lossless) {
    std::printf("lossless cast: %lld of %lld NVFP4 blocks exact\n", (long long)r.exact_blocks, (long long)r.blocks);
    for (const std::string& s : r.inexact) std::printf("  requantized: %s\n", s.c_str());
  }
  return 0;
}

}  // namespace nvfp4moe::cli
