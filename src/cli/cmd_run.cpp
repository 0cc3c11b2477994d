// `nvfp4moe run`: one MoE layer of a model directory on inputs from a
// safetensors file; writes the output (temp name + rename, so a failed run
// leaves an earlier output file intact).
#include <chrono>
#include <cstdio>
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/file_util.hpp"
#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/run_inputs.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/ep.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::cli {

namespace {

void print_usage() {
  std::printf(
      "usage: nvfp4moe run --model DIR --layer L --input X.safetensors --output Y.safetensors\n"
      "                    [--device cpu|cuda] [--ep R] [--threads N] [--static-input-scales] [--mtp]\n"
      "                    [--act nvfp4|bf16|fp8] [--fp8-mma]\n"
      "DIR: either checkpoint layout (DeepSeek's layers.L.ffn.* or Hugging Face's model.layers.L.mlp.*);\n"
      "--mtp: L is an MTP block (mtp.L.ffn.*). Routed experts NVFP4 or MXFP4 (DeepSeek's release).\n"
      "--act: how the routed experts' inputs are staged (docs/numerics.md section 7); default nvfp4 for\n"
      "NVFP4 experts, fp8 (DeepSeek's act_quant) for MXFP4 experts; --ep R on cuda takes nvfp4 only.\n"
      "--fp8-mma (cuda, --act fp8): the prefill GEMM on FP8 tensor cores where every expert's weight rows\n"
      "are E4M3 values times a power of two (docs/numerics.md section 8); the form used is printed.\n"
      "X: hidden_states [T, H] bf16|f32; optional token_ids [T] int32|int64 (required for hash-routed\n"
      "layers unless routing is given); optional topk_ids [T, k] int32|int64 + topk_weights [T, k] f32\n"
      "(GLOBAL ids or -1; the router is skipped). Y: output [T, H] bf16, topk_ids [T, k] int32,\n"
      "topk_weights [T, k] f32. --ep R runs R expert-parallel ranks emulated on the CPU, or with\n"
      "--device cuda R processes, one per GPU, over NCCL symmetric memory (docs/ep.md); with fewer GPUs\n"
      "than R (or no NCCL device API) the R ranks run emulated on GPU 0, said on stderr.\n");
}

// The layer on its front end: R expert-parallel ranks emulated on the CPU,
// or one Moe on the CPU or the GPU (sized for T tokens).
std::unique_ptr<MoeLayer> make_layer(MoeWeights weights, Backend device, int ranks, int threads, int64_t tokens,
                                     bool fp8_mma) {
  if (ranks > 1) return std::make_unique<CpuEpMoe>(weights, ranks, CpuEpOptions{.threads = threads});
  MoeOptions mo;
  mo.backend = device;
  mo.threads = threads;
  mo.max_tokens = std::max<int64_t>(mo.max_tokens, tokens);
  mo.fp8_mma = fp8_mma;
  auto m = std::make_unique<Moe>(std::move(weights), mo);
  if (fp8_mma) std::printf("prefill GEMM: %s\n", m->prefill_mma().c_str());
  return m;
}

}  // namespace

std::vector<Option> run_options() {
  return {flag("help"),
          text("model"),
          integer("layer", 0, kMaxLayer),
          text("input"),
          text("output"),
          choice("device", {"cpu", "cuda"}),
          integer("ep", 1, kMaxRanks),
          integer("threads", 1, kMaxThreads),
          flag("static-input-scales"),
          flag("mtp"),
          choice("act", {"nvfp4", "bf16", "fp8"}),
          flag("fp8-mma")};
}

int cmd_run(int argc, char** argv) {
  const Args args(argc, argv, run_options());
  if (args.has("help")) {
    print_usage();
    return 0;
  }
  const std::string model = args.require("model"), input = args.require("input"), output = args.require("output");
  const int layer = int(args.require_int("layer"));
  const Backend device = parse_backend(args.get("device", "cpu"));
  const int ranks = int(args.get_int("ep", 1));
  const int threads = int(args.get_int("threads", 0));  // 0: every core
  // The output before any work: a regular file (or absent, or a symlink to
  // one), and not one of the inputs.
  fileio::output_file_target(output);
  fileio::check_not_input(output, "--output", input, "--input");
  fileio::check_not_input(output, "--output", model, "--model");
  // --ep with --device cuda: R GPU processes over NCCL (cmd_ep_cuda.cpp, docs/ep.md).
  if (args.has("ep") && device == Backend::Cuda) return cmd_run_ep_cuda(argc, argv);

  const ModelDir dir(model);
  LoadOptions lo;
  lo.static_l1_input = lo.static_l2_input = args.has("static-input-scales");
  lo.mtp = args.has("mtp");
  if (args.has("act")) lo.activation = parse_activation_mode(args.get("act", ""));
  MoeWeights weights = load_moe_layer(dir, layer, lo);
  const MoeConfig cfg = weights.config;

  const RunInputs in = read_run_inputs(input, cfg, layer);
  const int64_t T = in.tokens, k = cfg.top_k;
  const auto t0 = std::chrono::steady_clock::now();
  const HostResult r =
      make_layer(std::move(weights), device, ranks, threads, T, args.has("fp8-mma"))->forward_host(in.batch());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<uint16_t> y(r.y.size());
  for (size_t i = 0; i < y.size(); ++i) y[i] = bf16_from_float(r.y[i]).bits;  // exact: r.y holds BF16 values
  SafetensorsWriter w;
  w.add("output", DType::BF16, {T, cfg.hidden}, y.data());
  w.add("topk_ids", DType::I32, {T, k}, r.topk_ids.data());
  w.add("topk_weights", DType::F32, {T, k}, r.topk_weights.data());
  w.set_metadata("layer", std::to_string(layer));
  w.write(output);
  std::printf("layer %d: %lld tokens on %s%s in %.3f s -> %s\n", layer, (long long)T, backend_name(device),
              ranks > 1 ? (" (" + std::to_string(ranks) + " expert-parallel ranks)").c_str() : "", secs,
              output.c_str());
  return 0;
}

}  // namespace nvfp4moe::cli
