// `nvfp4moe bench`: times the cuda forward of a DeepSeek-V4-Pro MoE layer
// (--model dsv4-flash: DeepSeek-V4-Flash's) and sets it against a roofline
// whose ceilings (HBM read bandwidth, dense BF16 GEMM rate) are measured in
// the same run.
//
// Workloads (caller-supplied uniform routing, so the router is not timed):
//   ep8: one rank of 8 — a Moe of an eighth of the experts (V4-Pro 48 of
//        384, V4-Flash 32 of 256) fed the pairs it receives from 8T tokens x
//        top-6 (slots of other ranks' experts -1, tokens with no local slot
//        dropped); routed experts only, as the per-rank local compute of an
//        expert-parallel layer;
//   ep1: all the experts and the shared expert on one GPU, T tokens (its
//        weights BF16, or with --shared fp8 block-scaled FP8 as both
//        DeepSeek-V4 releases hold them).
// Weights are random code bytes and sane scale bytes made directly (14 GB for
// V4-Pro's 384 experts), never quantized from dense values: NVFP4, or with --format
// mxfp4 MXFP4 as DeepSeek's release holds them (cli/bench_weights.hpp),
// which the device reads at the checkpoint's 4.25 bits a weight; --act picks
// the routed experts'
// activation mode (docs/numerics.md §7). Each timed forward uses the
// next of several routing/input sets so caches hold nothing useful between runs.
// Forwards are eager launches, host work included; with --graph each input
// set's forward is captured once into a CUDA graph and the graphs are
// replayed, as an engine's captured decode step runs the layer.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "checkpoint/file_util.hpp"
#include "cli/args.hpp"
#include "cli/bench_weights.hpp"
#include "cli/commands.hpp"
#include "cli/model_option.hpp"
#include "common/splitmix.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"

#ifdef NVFP4MOE_HAS_CUDA
#include <cuda_runtime.h>

#include "cli/bench_ceilings.hpp"
#include "cuda/cuda_check.hpp"
#include "moe/random_weights.hpp"
#endif

namespace nvfp4moe::cli {

namespace {

constexpr const char* kUsage =
    "usage: nvfp4moe bench [--workload ep8|ep1|both] [--model dsv4-pro|dsv4-flash]\n"
    "                      [--tokens 1,8,64,512,2048,8192] [--iters 10] [--warmup 3] [--seed S] [--csv FILE]\n"
    "                      [--device N] [--graph]   (each forward a replay of its captured CUDA graph)\n"
    "                      [--format nvfp4|mxfp4] [--act nvfp4|bf16|fp8]   (routed experts' weights, activations)\n"
    "                      [--shared bf16|fp8]   (the shared expert's weights, ep1 and --ep; default bf16)\n"
    "                      [--no-ceilings]   (use the design figures 4.41 TB/s, 789 TFLOP/s; for profilers)\n"
    "       nvfp4moe bench --ep R [--model dsv4-pro|dsv4-flash] [--experts E] [--tokens LIST] [--iters 20]\n"
    "                      [--warmup 3] [--seed S] [--combine f32|bf16] [--graph] [--max-tokens N] [--unbounded]\n"
    "                      [--shared bf16|fp8] [--breakdown 10]\n"
    "                      (R GPUs, one process each; --graph: one forward captured in a CUDA graph and replayed;\n"
    "                      --max-tokens: the layer sized for N tokens per rank; --unbounded: no per-forward\n"
    "                      token bound; --breakdown N: a table of where N eager forwards' time goes, phase by\n"
    "                      phase, and the bytes they move between GPUs (0: none); docs/ep.md)\n";

// What the routed experts are made of (weights and activations), and the
// shared expert's weights.
struct Formats {
  ExpertFormat weights = ExpertFormat::Nvfp4;
  ActivationMode act = ActivationMode::Nvfp4;
  SharedExpertFormat shared = SharedExpertFormat::Bf16;
  bool is_default() const { return weights == ExpertFormat::Nvfp4 && act == ActivationMode::Nvfp4; }
};

#ifdef NVFP4MOE_HAS_CUDA

using cuda::DeviceBuffer;

// One forward's inputs on the device.
struct InputSet {
  int64_t tokens = 0, pairs = 0, experts_touched = 0;
  DeviceBuffer<uint16_t> x;  // bf16 [T, H]
  DeviceBuffer<int32_t> ids;
  DeviceBuffer<float> weights;
};

// Routing for `src_tokens` tokens x top-k of E (distinct per token, uniform);
// slots outside [first, first+count) -> -1; with drop_empty, tokens without a
// local slot are dropped (the ep8 rank's view).
InputSet make_input(SplitMix64& rng, int64_t src_tokens, const MoeConfig& c, int64_t first, int64_t count,
                    bool drop_empty) {
  const int64_t k = c.top_k, H = c.hidden;
  std::vector<int32_t> ids;
  std::vector<float> w;
  std::vector<char> touched(size_t(count), 0);
  InputSet in;
  for (int64_t t = 0; t < src_tokens; ++t) {
    int32_t row[64];
    bool any = false;
    for (int64_t j = 0; j < k; ++j) {
      int32_t e;
      bool dup;
      do {
        e = int32_t(rng.next() % uint64_t(c.experts));
        dup = false;
        for (int64_t i = 0; i < j; ++i) dup |= row[i] == e;
      } while (dup);
      row[j] = e;
    }
    for (int64_t j = 0; j < k; ++j) {
      const bool local = row[j] >= first && row[j] < first + count;
      if (!local) row[j] = -1;
      any |= local;
    }
    if (drop_empty && !any) continue;
    for (int64_t j = 0; j < k; ++j) {
      ids.push_back(row[j]);
      w.push_back(1.5f / float(k));
      if (row[j] >= 0) {
        ++in.pairs;
        touched[size_t(row[j] - first)] = 1;
      }
    }
  }
  if (ids.empty()) {  // keep one token so the forward has something to do
    ids.assign(size_t(k), -1);
    w.assign(size_t(k), 0.0f);
  }
  in.tokens = int64_t(ids.size()) / k;
  for (char t : touched) in.experts_touched += t;
  std::vector<uint16_t> x(size_t(in.tokens * H));
  for (auto& v : x) {  // ~N(0,1)-ish: sum of uniforms
    const uint64_t r = rng.next();
    const float f = (float(r & 0xffff) + float((r >> 16) & 0xffff) + float((r >> 32) & 0xffff) - 98302.5f) / 32768.0f;
    v = bf16_from_float(f).bits;
  }
  in.x = DeviceBuffer<uint16_t>(x.size());
  in.x.upload(x.data(), x.size());
  in.ids = DeviceBuffer<int32_t>(ids.size());
  in.ids.upload(ids.data(), ids.size());
  in.weights = DeviceBuffer<float>(w.size());
  in.weights.upload(w.data(), w.size());
  return in;
}

struct Row {
  std::string workload;
  int64_t T = 0, tokens_in = 0, pairs = 0, experts = 0;
  double us = 0, bytes = 0, flops = 0, roof_us = 0;
  double ckpt_bytes = 0, ckpt_roof_us = 0;  // with the format's checkpoint bytes a weight
  const char* shared = "none";              // the shared expert's weights: none, bf16 or fp8
};

// The bytes of a shared expert's weights (none when it has none): BF16, or
// E4M3 with one FP32 factor per tile (on the device too).
double shared_expert_bytes(const SharedExpertWeights& s) {
  if (s.format == SharedExpertFormat::Bf16) return 2.0 * double(s.w1.size() + s.w3.size() + s.w2.size());
  return double(s.w1_fp8.size() + s.w3_fp8.size() + s.w2_fp8.size()) +
         4.0 * double(s.w1_scale.size() + s.w3_scale.size() + s.w2_scale.size());
}

struct Ceilings {
  double read_bps = 0, bf16_flops = 0;
};

void run_workload(const std::string& name, const MoeConfig& model, const std::vector<int64_t>& tlist, int iters,
                  int warmup, bool graph, uint64_t seed, int device, const Ceilings& ceil, Formats formats,
                  std::vector<Row>& rows) {
  const bool ep8 = name == "ep8";
  MoeConfig c = model;
  const int64_t first = 0, count = ep8 ? c.experts / 8 : c.experts;
  if (ep8) c.shared_experts = 0;  // per-rank local routed compute
  c.activation = formats.act;
  const int64_t H = c.hidden, I = c.intermediate, k = c.top_k;

  // Inputs first (their sizes decide max_tokens): a few sets per T, rotated.
  SplitMix64 rng{seed};
  std::vector<std::vector<InputSet>> sets;
  int64_t max_tokens = 1;
  for (int64_t T : tlist) {
    const int n_sets = T <= 64 ? 8 : (T <= 2048 ? 3 : 2);
    sets.emplace_back();
    for (int s = 0; s < n_sets; ++s) {
      sets.back().push_back(make_input(rng, ep8 ? 8 * T : T, c, first, count, ep8));
      max_tokens = std::max(max_tokens, sets.back().back().tokens);
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  const bool mx = formats.weights == ExpertFormat::Mxfp4;
  // MXFP4: the router and shared expert of the NVFP4 layer (made with one
  // expert, then replaced), the routed experts as MXFP4 bytes.
  MoeWeights w = make_random_nvfp4_moe(c, seed ^ 0x5eed, first, mx ? 1 : count, kRandomMoeVocab, formats.shared);
  if (mx) w.experts = make_random_mxfp4_experts(c, seed ^ 0x5eed, first, count);
  const double shared_bytes = shared_expert_bytes(w.shared);
  MoeOptions o;
  o.backend = Backend::Cuda;
  o.device = device;
  o.max_tokens = max_tokens;
  Moe moe(std::move(w), o);
  std::fprintf(stderr, "[%s] %lld experts generated and uploaded in %.1f s (max_tokens %lld)\n", name.c_str(),
               (long long)count, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
               (long long)max_tokens);

  const double expert_bytes = double(3 * H * I) * checkpoint_bits_per_weight(formats.weights) / 8;  // what the device reads
  const double ckpt_expert_bytes = double(3 * H * I) * checkpoint_bits_per_weight(formats.weights) / 8;
  DeviceBuffer<uint16_t> y(size_t(max_tokens * H));
  cuda::CudaStream stream;
  cuda::CudaEvent a, b;
  for (size_t ti = 0; ti < tlist.size(); ++ti) {
    auto& ss = sets[ti];
    auto forward = [&](InputSet& in) {
      RoutingArgs r;
      r.topk_ids = make_view(in.ids.get(), DType::I32, {in.tokens, k}, DeviceKind::Cuda, device);
      r.topk_weights = make_view(in.weights.get(), DType::F32, {in.tokens, k}, DeviceKind::Cuda, device);
      ForwardOutputs out;
      out.y = make_view(y.get(), DType::BF16, {in.tokens, H}, DeviceKind::Cuda, device);
      moe.forward(make_view(in.x.get(), DType::BF16, {in.tokens, H}, DeviceKind::Cuda, device), r, out,
                  ForwardOptions{.stream = stream.get()});
    };
    for (int i = 0; i < warmup; ++i) forward(ss[size_t(i) % ss.size()]);
    // --graph: one graph per input set, captured after the eager warm-up
    // (which also sizes cuBLAS's workspace outside any capture), each replayed once before timing.
    std::vector<cuda::CudaGraphExec> graphs;
    for (size_t i = 0; graph && i < ss.size(); ++i) {
      graphs.emplace_back(stream.get(), [&] { forward(ss[i]); });
      graphs.back().launch(stream.get());
    }
    std::vector<double> us;
    double pairs = 0, touched = 0, tokens_in = 0;
    for (int i = 0; i < iters; ++i) {
      InputSet& in = ss[size_t(i) % ss.size()];
      NVFP4_CUDA_CHECK(cudaEventRecord(a.get(), stream.get()));
      if (graph)
        graphs[size_t(i) % graphs.size()].launch(stream.get());
      else
        forward(in);
      NVFP4_CUDA_CHECK(cudaEventRecord(b.get(), stream.get()));
      NVFP4_CUDA_CHECK(cudaEventSynchronize(b.get()));
      float ms = 0;
      NVFP4_CUDA_CHECK(cudaEventElapsedTime(&ms, a.get(), b.get()));
      us.push_back(ms * 1e3);
      pairs += double(in.pairs);
      touched += double(in.experts_touched);
      tokens_in += double(in.tokens);
    }
    moe.sync_errors();
    std::sort(us.begin(), us.end());
    Row r;
    r.workload = name;
    r.T = tlist[ti];
    if (c.shared_experts) r.shared = formats.shared == SharedExpertFormat::Fp8Block ? "fp8" : "bf16";
    r.us = us[us.size() / 2];
    r.pairs = int64_t(pairs / iters + 0.5);
    r.experts = int64_t(touched / iters + 0.5);
    r.tokens_in = int64_t(tokens_in / iters + 0.5);
    r.bytes = touched / iters * expert_bytes + shared_bytes;
    r.ckpt_bytes = touched / iters * ckpt_expert_bytes + shared_bytes;
    r.flops = pairs / iters * 2.0 * 3.0 * double(H * I) +
              (c.shared_experts ? 2.0 * 3.0 * double(H * c.shared_inter()) * double(tlist[ti]) : 0.0);
    r.roof_us = std::max(r.bytes / ceil.read_bps, r.flops / ceil.bf16_flops) * 1e6;
    r.ckpt_roof_us = std::max(r.ckpt_bytes / ceil.read_bps, r.flops / ceil.bf16_flops) * 1e6;
    rows.push_back(r);
    std::fprintf(stderr, "[%s] T=%lld done: %.1f us\n", name.c_str(), (long long)r.T, r.us);
  }
}

#endif  // NVFP4MOE_HAS_CUDA

}  // namespace

int cmd_bench(int argc, char** argv) {
  // --help first: the usage covers both forms.
  if (mentions(argc, argv, "help")) {
    std::printf("%s", kUsage);
    return 0;
  }
  // --ep R: the forward over R GPU processes, NCCL symmetric memory (cmd_ep_cuda.cpp, docs/ep.md).
  if (mentions(argc, argv, "ep")) return cmd_bench_ep_cuda(argc, argv);
  const Args args(argc, argv,
                  {flag("help"), flag("no-ceilings"), flag("graph"), choice("workload", {"ep8", "ep1", "both"}),
                   choice("model", {"dsv4-pro", "dsv4-flash"}),
                   int_list("tokens", 1, 8192), integer("iters", 1, kMaxIters), integer("warmup", 0, kMaxIters),
                   integer("seed", 0, kMaxSeed), text("csv"), integer("device", 0, kMaxGpuIndex),
                   choice("format", {"nvfp4", "mxfp4"}), choice("act", {"nvfp4", "bf16", "fp8"}),
                   choice("shared", {"bf16", "fp8"})});
  const std::string workload = args.get("workload", "both");
  const std::string model_name = args.get("model", "dsv4-pro");
  const MoeConfig model = model_option_config(model_name);
  const std::vector<int64_t> tlist = args.get_int_list("tokens", "1,8,64,512,2048,8192");
  const int iters = int(args.get_int("iters", 10)), warmup = int(args.get_int("warmup", 3));
  const bool graph = args.has("graph");
  const Formats formats{parse_format_option(args.get("format", "nvfp4")),
                        parse_activation_mode(args.get("act", "nvfp4")),
                        parse_shared_format_option(args.get("shared", "bf16"))};
  if (const auto csv = args.value("csv")) fileio::output_file_target(*csv);  // refused before minutes of work
#ifndef NVFP4MOE_HAS_CUDA
  (void)iters, (void)warmup, (void)graph, (void)formats, (void)model;  // parsed and checked all the same
  NVFP4_FAIL("bench needs the cuda backend; this build has none");
#else
  NVFP4_CHECK(cuda_available(), "bench needs a CUDA device; none is available");
  const int device = int(args.get_int("device", 0));
  NVFP4_CUDA_CHECK(cudaSetDevice(device));
  Ceilings ceil;
  const bool measured = !args.has("no-ceilings");
  ceil.read_bps = measured ? cuda::measure_read_bandwidth(int64_t(4) << 30, 5) : 4.41e12;
  ceil.bf16_flops = measured ? cuda::measure_bf16_gemm_flops(8192, 8192, 8192, 5) : 789e12;
  std::printf("device: %s\n", cuda::device_description().c_str());
  std::printf("model: %s (H=%lld, I=%lld, %lld experts, top-%lld; ep8: %lld of them)\n", model_name.c_str(),
              (long long)model.hidden, (long long)model.intermediate, (long long)model.experts,
              (long long)model.top_k, (long long)model.experts / 8);
  std::printf("ceilings (%s): HBM read %.2f TB/s, BF16 GEMM %.0f TFLOP/s (cuBLAS 8192^3)\n",
              measured ? "measured now" : "design figures, not measured", ceil.read_bps / 1e12, ceil.bf16_flops / 1e12);
  const uint64_t seed = uint64_t(args.get_int("seed", 1234));
  std::vector<Row> rows;
  if (workload != "ep1") run_workload("ep8", model, tlist, iters, warmup, graph, seed, device, ceil, formats, rows);
  if (workload != "ep8")
    run_workload("ep1", model, tlist, iters, warmup, graph, seed + 1, device, ceil, formats, rows);
  std::printf("\ntiming: %s\n", graph ? "graph (each forward a replay of its input set's captured CUDA graph)"
                                        : "eager (each forward's launches and host work)");

  // The default (NVFP4 weights and activations) prints what it always has;
  // other formats say what they are, and MXFP4 adds its checkpoint's roofline.
  const bool mx = formats.weights == ExpertFormat::Mxfp4;
  const bool shared_fp8 = formats.shared == SharedExpertFormat::Fp8Block;
  if (shared_fp8 && workload != "ep8")
    std::printf("\nshared expert (ep1): block-scaled FP8 weights (E4M3, one power-of-two factor per 128 x 128 "
                "tile), GB counts a byte a weight and the factors\n");
  if (!formats.is_default())
    std::printf("\nrouted experts: %s weights, %s activations; GB, roof_us and frac count the bytes the device "
                "reads (%.2f bits a weight)%s\n", format_option_name(formats.weights),
                activation_mode_name(formats.act), checkpoint_bits_per_weight(formats.weights),
                mx ? "; ckpt_GB, ckpt_roof_us and ckpt_frac the MXFP4 checkpoint's (4.25 bits a weight), the "
                     "format's own roofline"
                   : "");
  std::printf("\n%-5s %6s %7s %7s %4s %11s %9s %9s %11s %11s %9s", "work", "T", "rows", "pairs", "exp", "time_us",
              "GB", "GFLOP", "TFLOP/s", "roof_us", "frac");
  if (mx) std::printf(" %9s %12s %9s", "ckpt_GB", "ckpt_roof_us", "ckpt_frac");
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf("%-5s %6lld %7lld %7lld %4lld %11.1f %9.3f %9.1f %11.1f %11.1f %8.1f%%", r.workload.c_str(),
                (long long)r.T, (long long)r.tokens_in, (long long)r.pairs, (long long)r.experts, r.us,
                r.bytes / 1e9, r.flops / 1e9, r.flops / (r.us * 1e-6) / 1e12, r.roof_us, 100.0 * r.roof_us / r.us);
    if (mx) std::printf(" %9.3f %12.1f %8.1f%%", r.ckpt_bytes / 1e9, r.ckpt_roof_us, 100.0 * r.ckpt_roof_us / r.us);
    std::printf("\n");
  }
  if (auto csv = args.value("csv")) {
    // Other formats append theirs and the checkpoint's roofline, an FP8 shared
    // expert a column `shared`, another model than V4-Pro a column `model`,
    // --graph a last column `timing` (bench/perf_table.py reads every form).
    const bool other_model = model_name != "dsv4-pro";
    std::string text = "workload,T,rows,pairs,experts,time_us,bytes,flops,roofline_us,fraction";
    if (!formats.is_default()) text += ",format,act,checkpoint_bytes,checkpoint_roofline_us,checkpoint_fraction";
    if (shared_fp8) text += ",shared";
    if (other_model) text += ",model";
    text += graph ? ",timing\n" : "\n";
    for (const Row& r : rows) {
      char line[512];
      std::snprintf(line, sizeof line, "%s,%lld,%lld,%lld,%lld,%.2f,%.0f,%.0f,%.2f,%.4f", r.workload.c_str(),
                    (long long)r.T, (long long)r.tokens_in, (long long)r.pairs, (long long)r.experts, r.us, r.bytes,
                    r.flops, r.roof_us, r.roof_us / r.us);
      text += line;
      if (!formats.is_default()) {
        std::snprintf(line, sizeof line, ",%s,%s,%.0f,%.2f,%.4f", format_option_name(formats.weights),
                      activation_mode_name(formats.act), r.ckpt_bytes, r.ckpt_roof_us, r.ckpt_roof_us / r.us);
        text += line;
      }
      if (shared_fp8) text += std::string(",") + r.shared;
      if (other_model) text += "," + model_name;
      text += graph ? ",graph\n" : "\n";
    }
    fileio::write_file_atomic(*csv, text);  // temporary name + rename, like every output
  }
  return 0;
#endif
}

}  // namespace nvfp4moe::cli
