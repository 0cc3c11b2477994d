// `nvfp4moe bench --ep R` and `nvfp4moe run --ep R --device cuda`: expert
// parallelism over R GPUs, one process per GPU (ep/nccl_launcher.hpp).
//
// The command first runs as the launcher: it re-executes itself R times with
// the rank environment set and waits. Each rank process lands here again,
// joins the NCCL communicator and does its part:
//   bench: random NVFP4 weights of its expert slice (bytes made directly),
//          T tokens of its own per row, uniform top-k routing over all E;
//          rank 0 prints the table.
//   run:   loads its expert slice of the layer, takes its contiguous chunk of
//          the input tokens (routing from the file, or the router on the
//          host for its own tokens), writes its rows to a part file; the
//          launcher joins the parts into the output (temp name + rename).
//          With fewer GPUs than ranks, or a build without NCCL's device API,
//          `run` runs the R ranks emulated on GPU 0 in this process instead
//          (EpCudaEmulation: the same kernels and indexing, docs/ep.md) and
//          says so in one line on stderr.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_option.hpp"
#include "cli/run_inputs.hpp"
#include "common/splitmix.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

#if defined(NVFP4MOE_HAS_CUDA)
#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#include "ep/ep_index.hpp"
#include "ep/nccl_launcher.hpp"
#include "moe/backend.hpp"
#include "cli/bench_weights.hpp"
#include "moe/random_weights.hpp"
#include "nvfp4moe/ep_cuda.hpp"
#endif

namespace nvfp4moe::cli {

#if defined(NVFP4MOE_HAS_CUDA)

namespace {

std::vector<std::string> relaunch_args(const char* sub, int argc, char** argv) {
  std::vector<std::string> a = {"nvfp4moe", sub};
  for (int i = 0; i < argc; ++i) a.push_back(argv[i]);
  return a;
}

// Uniform top-k routing: k distinct GLOBAL experts per token, weights 1/k.
void uniform_routing(uint64_t seed, int64_t T, int64_t k, int64_t E, std::vector<int32_t>& ids,
                     std::vector<float>& w) {
  ids.resize(size_t(T * k));
  w.assign(size_t(T * k), 1.0f / float(k));
  SplitMix64 rng{seed};
  std::vector<int32_t> pool(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) pool[size_t(e)] = int32_t(e);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t pick = j + int64_t(rng.next() % uint64_t(E - j));
      std::swap(pool[size_t(j)], pool[size_t(pick)]);
      ids[size_t(t * k + j)] = pool[size_t(j)];
    }
  }
}

// What `bench --ep` was asked for.
struct EpBenchOptions {
  std::string model;
  MoeConfig cfg;
  std::vector<int64_t> tokens;
  int iters = 20, warmup = 3;
  bool combine_bf16 = false, graph = false, unbounded = false;
  SharedExpertFormat shared = SharedExpertFormat::Bf16;  // --shared fp8: block-scaled, as both DeepSeek-V4 releases
  uint64_t seed = 1;
  // --max-tokens N: every layer object sized for N tokens per rank (a
  // deployment's largest batch) while T tokens run; each forward passes T as
  // its token bound unless --unbounded (then launches and the expert GEMMs'
  // choice follow N).
  int64_t max_tokens = 0;
  // --breakdown N: after each T's timing, N eager forwards with events
  // between their phases (0: none).
  int breakdown_forwards = 10;
};

EpBenchOptions parse_ep_bench(const Args& args) {
  EpBenchOptions o;
  o.model = args.get("model", "dsv4-pro");  // a choice of dsv4-pro, dsv4-flash (bench options)
  o.cfg = model_option_config(o.model);
  // --experts E: the geometry with fewer experts (e.g. one EP8 rank's 48 on one GPU).
  o.cfg.experts = args.get_int("experts", o.cfg.experts);
  NVFP4_CHECK(o.cfg.experts >= o.cfg.top_k, "--experts: need at least k=", o.cfg.top_k, " experts, got ",
              o.cfg.experts);
  o.tokens = args.get_int_list("tokens", "1,8,64,512");
  o.iters = int(args.get_int("iters", 20));
  o.warmup = int(args.get_int("warmup", 3));
  const std::string combine = args.get("combine", "f32");
  NVFP4_CHECK(combine == "f32" || combine == "bf16", "--combine: f32 or bf16, got '", combine, "'");
  o.combine_bf16 = combine == "bf16";
  o.seed = uint64_t(args.get_int("seed", 1));
  o.graph = args.has("graph");
  o.max_tokens = args.get_int("max-tokens", 0);
  o.unbounded = args.has("unbounded");
  o.shared = parse_shared_format_option(args.get("shared", "bf16"));
  o.breakdown_forwards = int(args.get_int("breakdown", 10));  // bounds checked by Args: 0 .. kMaxIters
  return o;
}

// One rank's T tokens on the device: random x, uniform routing over all E.
struct EpBenchBatch {
  cuda::DeviceBuffer<float> x, weights;
  cuda::DeviceBuffer<int32_t> ids;
  cuda::DeviceBuffer<uint16_t> y;
  std::vector<int32_t> host_ids;  // the routing, for the bytes it moves between GPUs
  TensorView xv;
  RoutingArgs routing;
  ForwardOutputs out;
};
EpBenchBatch make_ep_batch(const EpBenchOptions& o, int me, int64_t T) {
  const int64_t H = o.cfg.hidden, k = o.cfg.top_k;
  std::vector<float> x(size_t(T * H));
  SplitMix64 rng{o.seed * 1315423911u + uint64_t(me) * 2654435761u + uint64_t(T)};
  for (float& v : x) v = float(int64_t(rng.next() % 2001) - 1000) * 1e-3f;
  std::vector<int32_t> ids;
  std::vector<float> wts;
  uniform_routing(rng.state, T, k, o.cfg.experts, ids, wts);
  EpBenchBatch b{cuda::DeviceBuffer<float>(x.size()), cuda::DeviceBuffer<float>(wts.size()),
                 cuda::DeviceBuffer<int32_t>(ids.size()), cuda::DeviceBuffer<uint16_t>(size_t(T * H))};
  b.x.upload(x.data(), x.size());
  b.weights.upload(wts.data(), wts.size());
  b.ids.upload(ids.data(), ids.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());  // the pageable sources go out of scope
  b.host_ids = std::move(ids);
  b.xv = make_view(b.x.get(), DType::F32, {T, H}, DeviceKind::Cuda);
  b.routing.topk_ids = make_view(b.ids.get(), DType::I32, {T, k}, DeviceKind::Cuda);
  b.routing.topk_weights = make_view(b.weights.get(), DType::F32, {T, k}, DeviceKind::Cuda);
  b.out.y = make_view(b.y.get(), DType::BF16, {T, H}, DeviceKind::Cuda);
  return b;
}

// Microseconds per forward over `iters` forwards after `warmup` (eager, or one
// captured forward replayed with --graph, so launch rate and GPU time separate).
double time_ep_forward(NcclEpMoe& moe, const EpBenchBatch& b, const ForwardOptions& fo, const EpBenchOptions& o) {
  cuda::CudaEvent e0, e1;
  for (int i = 0; i < o.warmup; ++i) moe.forward(b.xv, b.routing, b.out, fo);
  const cudaStream_t s = static_cast<cudaStream_t>(fo.stream);
  std::optional<cuda::CudaGraphExec> graph;
  if (o.graph) {
    graph.emplace(s, [&] { moe.forward(b.xv, b.routing, b.out, fo); });
    for (int i = 0; i < o.warmup; ++i) graph->launch(s);
  }
  NVFP4_CUDA_CHECK(cudaEventRecord(e0.get(), s));
  for (int i = 0; i < o.iters; ++i) {
    if (graph)
      graph->launch(s);
    else
      moe.forward(b.xv, b.routing, b.out, fo);
  }
  NVFP4_CUDA_CHECK(cudaEventRecord(e1.get(), s));
  NVFP4_CUDA_CHECK(cudaEventSynchronize(e1.get()));
  float ms = 0.0f;
  NVFP4_CUDA_CHECK(cudaEventElapsedTime(&ms, e0.get(), e1.get()));
  moe.sync_errors();
  return 1e3 * double(ms) / std::max(1, o.iters);
}

// Where an eager forward's time goes: the median of each phase over
// `forwards` timed forwards of this rank (each waited for before the next),
// then the max over ranks of each; and the bytes the forward moves between
// GPUs (ep_home_traffic of every rank's tokens, summed over ranks).
struct EpBreakdown {
  EpPhaseTimes ms;        // each field the max over ranks of its median
  ep::EpTraffic traffic;  // all ranks
};
// Every field of EpPhaseTimes, for medians and reductions over them.
std::vector<EpPhaseField> phase_fields() {
  std::vector<EpPhaseField> f(std::begin(kEpPhases), std::end(kEpPhases));
  f.push_back(&EpPhaseTimes::total);
  f.push_back(&EpPhaseTimes::shared_expert);
  return f;
}
EpBreakdown ep_breakdown(NcclEpMoe& moe, const ep::NcclComm& comm, const EpBenchBatch& b, const ForwardOptions& fo,
                         const ep::SegmentLayout& geometry, int me, int64_t T, int forwards) {
  std::vector<EpPhaseTimes> runs;
  moe.set_phase_timing(true);
  for (int i = 0; i < forwards; ++i) {
    moe.forward(b.xv, b.routing, b.out, fo);
    runs.push_back(moe.phase_times());
  }
  moe.set_phase_timing(false);
  moe.sync_errors();
  const std::vector<EpPhaseField> fields = phase_fields();
  std::vector<double> medians;
  for (const auto field : fields) {
    std::vector<double> v;
    for (const EpPhaseTimes& r : runs) v.push_back(r.*field);
    std::sort(v.begin(), v.end());
    medians.push_back(v[v.size() / 2]);
  }
  ep::host_allreduce(comm, medians, ep::HostReduce::Max);
  EpBreakdown out;
  for (size_t i = 0; i < medians.size(); ++i) out.ms.*fields[i] = float(medians[i]);
  const ep::EpTraffic mine = ep::ep_home_traffic(geometry, me, b.host_ids.data(), T);
  std::vector<double> bytes = {double(mine.dispatch_bytes), double(mine.combine_bytes), double(mine.remote_pairs)};
  ep::host_allreduce(comm, bytes, ep::HostReduce::Sum);
  out.traffic = ep::EpTraffic{uint64_t(bytes[0]), uint64_t(bytes[1]), int64_t(bytes[2])};
  return out;
}

int bench_rank(const ep::RankEnv& env, const Args& args) {
  const EpBenchOptions o = parse_ep_bench(args);
  const MoeConfig& cfg = o.cfg;
  const int R = env.world, me = env.rank;
  NVFP4_CHECK(cfg.experts % R == 0, "--ep ", R, ": E=", cfg.experts, " is not divisible by the rank count");
  ep::NcclComm comm(env);
  const int64_t epr = cfg.experts / R, k = cfg.top_k;
  const MoeWeights w = make_random_nvfp4_moe(cfg, o.seed, me * epr, epr, kRandomMoeVocab, o.shared);
  if (me == 0)
    std::printf("expert parallel over %d GPUs (NCCL symmetric memory, LSA barriers), %s: H=%lld I=%lld E=%lld "
                "(%lld per rank) k=%lld, %s shared expert, %s combine, %s, layer sized for %s, %s\n"
                "%8s %12s %14s %12s\n",
                R, o.model.c_str(), (long long)cfg.hidden, (long long)cfg.intermediate, (long long)cfg.experts,
                (long long)epr, (long long)k, o.shared == SharedExpertFormat::Fp8Block ? "FP8" : "BF16", o.combine_bf16 ? "bf16" : "f32",
                o.graph ? "one captured forward replayed" : "eager launches",
                o.max_tokens > 0 ? (std::to_string(o.max_tokens) + " tokens per rank").c_str() : "each T",
                o.unbounded ? "no per-forward token bound" : "token bound T per forward", "T/rank", "us/forward",
                "tokens/s (all)", "symm MB");
  cuda::CudaStream stream;
  std::string breakdown;  // rank 0: one row per T, printed after the table
  for (const int64_t T : o.tokens) {
    NVFP4_CHECK(o.max_tokens == 0 || T <= o.max_tokens, "--tokens: T=", T, " is above --max-tokens ", o.max_tokens);
    const int64_t N = o.max_tokens > 0 ? o.max_tokens : T;  // tokens per rank the layer object is sized for
    EpCudaOptions eo;
    eo.max_tokens_per_rank = N;
    eo.combine_bf16 = o.combine_bf16;
    // Uniform routing: a rank receives N*k pairs on average; room for 2x
    // (all R*N*k when that is small, so short rows never overflow).
    eo.recv_capacity = std::min<int64_t>(R * N * k, std::max<int64_t>(2 * N * k, 4096));
    NcclEpMoe moe(comm.get(), w, eo);
    const EpBenchBatch b = make_ep_batch(o, me, T);
    const double us = time_ep_forward(
        moe, b, ForwardOptions{.stream = stream.get(), .max_tokens_any_rank = o.unbounded ? 0 : T}, o);
    if (me == 0)
      std::printf("%8lld %12.1f %14.0f %12.1f\n", (long long)T, us, double(R * T) / (us * 1e-6),
                  double(moe.symm_bytes()) / 1e6);
    std::fflush(stdout);
    if (o.breakdown_forwards > 0) {
      const ep::SegmentLayout geometry = ep::make_segment_layout(int32_t(cfg.hidden), int32_t(k), int32_t(cfg.experts),
                                                                 R, int32_t(N), 1, o.combine_bf16);
      const EpBreakdown d = ep_breakdown(
          moe, comm, b, ForwardOptions{.stream = stream.get(), .max_tokens_any_rank = o.unbounded ? 0 : T}, geometry,
          me, T, o.breakdown_forwards);
      // NVLink rate: a rank's share of the bytes over its dispatch and experts
      // phases (the down GEMM pushes the results as it computes them).
      const EpPhaseTimes& t = d.ms;
      const double moved = double(d.traffic.dispatch_bytes + d.traffic.combine_bytes);
      const double link_ms = double(t.dispatch) + double(t.experts);
      char row[320];
      std::snprintf(row, sizeof row,
                    "%8lld %8.1f | %7.1f %7.1f %8.1f %8.1f %7.1f %7.1f | %7.1f | %9.2f %8.2f %9.1f\n",
                    (long long)T, 1e3 * t.total, 1e3 * t.stage, 1e3 * t.barrier_in, 1e3 * t.dispatch, 1e3 * t.experts,
                    1e3 * t.barrier_out, 1e3 * t.combine, 1e3 * t.shared_expert,
                    double(d.traffic.dispatch_bytes) / 1e6, double(d.traffic.combine_bytes) / 1e6,
                    link_ms > 0.0 && R > 1 ? moved / R / (link_ms * 1e-3) / 1e9 : 0.0);
      breakdown += row;
    }
  }
  if (me == 0 && !breakdown.empty()) {
    std::printf("\nwhere an eager forward's time goes, us: each phase the median of %d forwards (events between the "
                "phases, each forward waited for), the max over ranks; the shared expert runs on a side stream beside "
                "stage .. barrier; NVLink: the MB all ranks move between GPUs a forward, and a rank's share over its "
                "dispatch + experts time (the down GEMM pushes the results)\n"
                "%8s %8s | %7s %7s %8s %8s %7s %7s | %7s | %9s %8s %9s\n",
                o.breakdown_forwards, "T/rank", "total", "stage", "barrier", "dispatch", "experts", "barrier",
                "combine", "shared", "disp. MB", "comb. MB", "GB/s");
    std::fputs(breakdown.c_str(), stdout);
  }
  return 0;
}

std::string part_path(const std::string& output, int rank) { return output + ".ep-rank" + std::to_string(rank); }

// The tokens of a forward_host result [n, H] (BF16 values) and its routing
// [n, k], as `run` writes them.
void write_run_result(const std::string& path, const HostResult& r, int64_t n, int64_t H, int64_t k) {
  std::vector<uint16_t> yb(r.y.size());
  for (size_t i = 0; i < r.y.size(); ++i) yb[i] = bf16_from_float(r.y[i]).bits;  // exact: r.y holds BF16 values
  SafetensorsWriter w;
  w.add("output", DType::BF16, {n, H}, yb.data());
  w.add("topk_ids", DType::I32, {n, k}, r.topk_ids.data());
  w.add("topk_weights", DType::F32, {n, k}, r.topk_weights.data());
  w.write(path);
}

void check_run_ep_args(const Args& args) {
  NVFP4_CHECK(!args.has("static-input-scales"),
              "--static-input-scales is not supported with --ep on cuda yet (each rank loads only its experts)");
}

// The tokens a rank holds at most: the largest chunk of T over R.
int64_t largest_chunk(int64_t T, int R) { return std::max<int64_t>(1, ep_token_begin(T, R, 1)); }

// `run --ep R --device cuda` where R rank processes cannot run (fewer GPUs
// than R, or no NCCL device API in this build): the R ranks emulated on GPU
// 0, each with its expert slice, its token chunk and its own router, the
// phases rank after rank (EpCudaEmulation).
int run_emulated(const Args& args, int R, const std::string& why) {
  const std::string model = args.require("model"), input = args.require("input"), output = args.require("output");
  const int layer = int(args.require_int("layer"));
  check_run_ep_args(args);
  std::fprintf(stderr, "nvfp4moe run: --ep %d on cuda: %s; the %d ranks run emulated on GPU 0 (docs/ep.md)\n", R,
               why.c_str(), R);
  const auto t0 = std::chrono::steady_clock::now();
  const ModelDir dir(model);
  const MoeWeights w = load_moe_layer(dir, layer, LoadOptions{});
  const MoeConfig& cfg = w.config;
  NVFP4_CHECK(cfg.experts % R == 0, "--ep ", R, ": E=", cfg.experts, " is not divisible by the rank count");
  const RunInputs in = read_run_inputs(input, cfg, layer);
  EpCudaOptions o;
  o.max_tokens_per_rank = largest_chunk(in.tokens, R);
  o.checked = true;
  EpCudaEmulation moe(w, R, o);
  write_run_result(output, moe.forward_host(in.batch()), in.tokens, cfg.hidden, cfg.top_k);
  std::printf("layer %d: %d expert-parallel ranks emulated on GPU 0 in %.3f s -> %s\n", layer, R,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), output.c_str());
  return 0;
}

int run_rank(const ep::RankEnv& env, const Args& args) {
  const std::string model = args.require("model"), input = args.require("input"), output = args.require("output");
  const int layer = int(args.require_int("layer"));
  check_run_ep_args(args);
  const int R = env.world, me = env.rank;
  const ModelDir dir(model);
  const MoeConfig c0 = read_moe_config(dir, layer);
  NVFP4_CHECK(c0.experts % R == 0, "--ep ", R, ": E=", c0.experts, " is not divisible by the rank count");
  LoadOptions lo;
  lo.first_expert = me * (c0.experts / R);
  lo.expert_count = c0.experts / R;
  const MoeWeights w = load_moe_layer(dir, layer, lo);
  const MoeConfig& cfg = w.config;
  const int64_t H = cfg.hidden, k = cfg.top_k;

  const RunInputs all = read_run_inputs(input, cfg, layer);
  const int64_t T = all.tokens;
  const int64_t b = ep_token_begin(T, R, me), e = ep_token_begin(T, R, me + 1), n = e - b;
  const RunInputs in = all.rows(b, e, H, k);
  ep::NcclComm comm(env);
  EpCudaOptions o;
  o.max_tokens_per_rank = largest_chunk(T, R);
  o.checked = true;
  NcclEpMoe moe(comm.get(), w, o);
  write_run_result(part_path(output, me), moe.forward_host(in.batch()), n, H, k);
  return 0;
}

// The launcher's last step: rank parts -> one output file, then the parts go.
void join_parts(const std::string& output, int R) {
  std::vector<uint8_t> y, ids, wts;
  int64_t T = 0, H = 0, k = 0;
  for (int r = 0; r < R; ++r) {
    const SafetensorsFile f(part_path(output, r));
    const TensorInfo* a = f.find("output");
    const TensorInfo* b = f.find("topk_ids");
    const TensorInfo* c = f.find("topk_weights");
    NVFP4_CHECK(a && b && c, part_path(output, r), ": rank part is incomplete");
    T += a->shape[0];
    H = a->shape[1];
    k = b->shape[1];
    y.insert(y.end(), a->data, a->data + a->nbytes);
    ids.insert(ids.end(), b->data, b->data + b->nbytes);
    wts.insert(wts.end(), c->data, c->data + c->nbytes);
  }
  SafetensorsWriter w;
  w.add_owned("output", DType::BF16, {T, H}, std::move(y));
  w.add_owned("topk_ids", DType::I32, {T, k}, std::move(ids));
  w.add_owned("topk_weights", DType::F32, {T, k}, std::move(wts));
  w.write(output);
  for (int r = 0; r < R; ++r) std::remove(part_path(output, r).c_str());
}

}  // namespace

int cmd_bench_ep_cuda(int argc, char** argv) {
  const Args args(argc, argv,
                  {flag("help"), integer("ep", 1, kMaxRanks), choice("model", {"dsv4-pro", "dsv4-flash"}),
                   integer("experts", 1, 1 << 16), int_list("tokens", 1, kMaxTokens), integer("iters", 1, kMaxIters),
                   integer("warmup", 0, kMaxIters), integer("seed", 0, kMaxSeed),
                   integer("device", 0, kMaxGpuIndex), choice("workload", {"ep8", "ep1", "both"}),
                   choice("combine", {"f32", "bf16"}), flag("graph"), integer("max-tokens", 1, kMaxTokens),
                   flag("unbounded"), choice("shared", {"bf16", "fp8"}), integer("breakdown", 0, kMaxIters)});
  const int R = int(args.get_int("ep", 1));
  if (const auto env = ep::rank_env()) return bench_rank(*env, args);
  NVFP4_CHECK(nccl_ep_available(), "--ep ", R, " on GPUs needs NCCL: this build has none (-DNCCL_ROOT=<dir>)");
  return ep::launch_ranks(R, relaunch_args("bench", argc, argv));
}

int cmd_run_ep_cuda(int argc, char** argv) {
  const Args args(argc, argv, run_options());
  const int R = int(args.get_int("ep", 1));
  (void)args.require_int("layer");  // checked before any rank starts
  if (const auto env = ep::rank_env()) return run_rank(*env, args);
  const int gpus = cuda_device_count();
  NVFP4_CHECK(gpus > 0, "--ep ", R, " --device cuda: no CUDA device is available (without --device cuda, --ep ", R,
              " emulates the ranks on the CPU)");
  if (!nccl_ep_available()) return run_emulated(args, R, "this build has no NCCL with the device API");
  if (gpus < R)
    return run_emulated(args, R, "this machine has " + std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs") +
                                     ", one rank process per GPU needs " + std::to_string(R));
  const std::string output = args.require("output");
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = ep::launch_ranks(R, relaunch_args("run", argc, argv));
  if (rc != 0) {
    for (int r = 0; r < R; ++r) std::remove(part_path(output, r).c_str());
    return rc;  // the output file, if any, is untouched
  }
  join_parts(output, R);
  std::printf("layer %lld: %d expert-parallel GPU ranks in %.3f s -> %s\n", (long long)args.get_int("layer", -1), R,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), output.c_str());
  return 0;
}

#else  // !NVFP4MOE_HAS_CUDA

int cmd_bench_ep_cuda(int, char**) {
  NVFP4_FAIL("--ep on GPUs: this build of nvfp4moe has no CUDA backend");
}
int cmd_run_ep_cuda(int, char**) { NVFP4_FAIL("--ep with --device cuda: this build of nvfp4moe has no CUDA backend"); }

#endif

}  // namespace nvfp4moe::cli
