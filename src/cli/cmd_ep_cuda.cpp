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
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "common/splitmix.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"

#if defined(NVFP4MOE_HAS_CUDA)
#include <cuda_runtime.h>

#include "cpu/cpu_moe.hpp"
#include "ep/nccl_launcher.hpp"
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

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ','))
    if (!item.empty()) v.push_back(std::stoll(item));
  NVFP4_CHECK(!v.empty(), "--tokens: expected a comma-separated list of token counts, got '", s, "'");
  return v;
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

#define EP_CLI_CUDA(call)                                                                                  \
  do {                                                                                                     \
    cudaError_t _e = (call);                                                                               \
    NVFP4_CHECK(_e == cudaSuccess, "CUDA error ", cudaGetErrorName(_e), " in ", #call);                    \
  } while (0)

int bench_rank(const ep::RankEnv& env, const Args& args) {
  const std::string model = args.get("model", "dsv4-pro");
  MoeConfig cfg = model == "dsv4-flash" ? dsv4_flash_config() : dsv4_pro_config();
  NVFP4_CHECK(model == "dsv4-pro" || model == "dsv4-flash", "--model: dsv4-pro or dsv4-flash, got '", model, "'");
  // --experts E: the geometry with fewer experts (e.g. one EP8 rank's 48 on one GPU).
  cfg.experts = args.get_int("experts", cfg.experts);
  NVFP4_CHECK(cfg.experts >= cfg.top_k, "--experts: need at least k=", cfg.top_k, " experts, got ", cfg.experts);
  const std::vector<int64_t> tokens = parse_list(args.get("tokens", "1,8,64,512"));
  const int iters = int(args.get_int("iters", 20)), warmup = int(args.get_int("warmup", 3));
  const std::string combine = args.get("combine", "f32");
  NVFP4_CHECK(combine == "f32" || combine == "bf16", "--combine: f32 or bf16, got '", combine, "'");
  const uint64_t seed = uint64_t(args.get_int("seed", 1));
  const bool use_graph = args.has("graph");
  // --max-tokens N: every layer object sized for N tokens per rank (a
  // deployment's largest batch) while T tokens run; each forward passes T as
  // its token bound unless --unbounded (then launches and the expert GEMMs'
  // choice follow N).
  const int64_t max_tokens = args.get_int("max-tokens", 0);
  const bool unbounded = args.has("unbounded");
  const int R = env.world, me = env.rank;
  NVFP4_CHECK(cfg.experts % R == 0, "--ep ", R, ": E=", cfg.experts, " is not divisible by the rank count");
  ep::NcclComm comm(env);
  const int64_t epr = cfg.experts / R, H = cfg.hidden, k = cfg.top_k;
  const MoeWeights w = cuda::make_random_nvfp4_moe(cfg, seed, me * epr, epr);
  if (me == 0)
    std::printf("expert parallel over %d GPUs (NCCL symmetric memory, LSA barriers), %s: H=%lld I=%lld E=%lld "
                "(%lld per rank) k=%lld, %s combine, %s, layer sized for %s, %s\n%8s %12s %14s %12s\n",
                R, model.c_str(), (long long)H, (long long)cfg.intermediate, (long long)cfg.experts, (long long)epr,
                (long long)k, combine.c_str(), use_graph ? "one captured forward replayed" : "eager launches",
                max_tokens > 0 ? (std::to_string(max_tokens) + " tokens per rank").c_str() : "each T",
                unbounded ? "no per-forward token bound" : "token bound T per forward",
                "T/rank", "us/forward", "tokens/s (all)", "symm MB");
  for (const int64_t T : tokens) {
    NVFP4_CHECK(T >= 1, "--tokens: token counts must be >= 1, got ", T);
    NVFP4_CHECK(max_tokens == 0 || T <= max_tokens, "--tokens: T=", T, " is above --max-tokens ", max_tokens);
    const int64_t N = max_tokens > 0 ? max_tokens : T;  // tokens per rank the layer object is sized for
    EpCudaOptions o;
    o.max_tokens_per_rank = N;
    o.combine_bf16 = combine == "bf16";
    // Uniform routing: a rank receives N*k pairs on average; room for 2x
    // (all R*N*k when that is small, so short rows never overflow).
    o.recv_capacity = std::min<int64_t>(R * N * k, std::max<int64_t>(2 * N * k, 4096));
    const int64_t bound = unbounded ? 0 : T;
    NcclEpMoe moe(comm.get(), w, o);
    std::vector<float> x(size_t(T * H));
    SplitMix64 rng{seed * 1315423911u + uint64_t(me) * 2654435761u + uint64_t(T)};
    for (float& v : x) v = float(int64_t(rng.next() % 2001) - 1000) * 1e-3f;
    std::vector<int32_t> ids;
    std::vector<float> wts;
    uniform_routing(rng.state, T, k, cfg.experts, ids, wts);
    float *dx = nullptr, *dw = nullptr;
    int32_t* di = nullptr;
    void* dy = nullptr;
    EP_CLI_CUDA(cudaMalloc(&dx, x.size() * 4));
    EP_CLI_CUDA(cudaMalloc(&dw, wts.size() * 4));
    EP_CLI_CUDA(cudaMalloc(&di, ids.size() * 4));
    EP_CLI_CUDA(cudaMalloc(&dy, size_t(T * H) * 2));
    EP_CLI_CUDA(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    EP_CLI_CUDA(cudaMemcpy(dw, wts.data(), wts.size() * 4, cudaMemcpyHostToDevice));
    EP_CLI_CUDA(cudaMemcpy(di, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice));
    RoutingArgs r;
    r.topk_ids = make_view(di, DType::I32, {T, k}, DeviceKind::Cuda);
    r.topk_weights = make_view(dw, DType::F32, {T, k}, DeviceKind::Cuda);
    ForwardOutputs out;
    out.y = make_view(dy, DType::BF16, {T, H}, DeviceKind::Cuda);
    const TensorView xv = make_view(dx, DType::F32, {T, H}, DeviceKind::Cuda);
    cudaStream_t stream = nullptr;
    cudaEvent_t e0 = nullptr, e1 = nullptr;
    EP_CLI_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    EP_CLI_CUDA(cudaEventCreate(&e0));
    EP_CLI_CUDA(cudaEventCreate(&e1));
    for (int i = 0; i < warmup; ++i) moe.forward(xv, r, out, ForwardOptions{.stream = stream, .max_tokens_any_rank = bound});
    // --graph: one forward captured and replayed, so launch rate and GPU time separate.
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    if (use_graph) {
      EP_CLI_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      moe.forward(xv, r, out, ForwardOptions{.stream = stream, .max_tokens_any_rank = bound});
      EP_CLI_CUDA(cudaStreamEndCapture(stream, &graph));
      EP_CLI_CUDA(cudaGraphInstantiate(&exec, graph, 0));
      for (int i = 0; i < warmup; ++i) EP_CLI_CUDA(cudaGraphLaunch(exec, stream));
    }
    EP_CLI_CUDA(cudaEventRecord(e0, stream));
    for (int i = 0; i < iters; ++i) {
      if (use_graph) {
        EP_CLI_CUDA(cudaGraphLaunch(exec, stream));
      } else {
        moe.forward(xv, r, out, ForwardOptions{.stream = stream, .max_tokens_any_rank = bound});
      }
    }
    EP_CLI_CUDA(cudaEventRecord(e1, stream));
    EP_CLI_CUDA(cudaEventSynchronize(e1));
    float ms = 0.0f;
    EP_CLI_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    moe.sync_errors();
    const double us = 1e3 * double(ms) / std::max(1, iters);
    if (me == 0)
      std::printf("%8lld %12.1f %14.0f %12.1f\n", (long long)T, us, double(R * T) / (us * 1e-6),
                  double(moe.symm_bytes()) / 1e6);
    std::fflush(stdout);
    if (exec) cudaGraphExecDestroy(exec);
    if (graph) cudaGraphDestroy(graph);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(di);
    cudaFree(dy);
  }
  return 0;
}

std::string part_path(const std::string& output, int rank) { return output + ".ep-rank" + std::to_string(rank); }

std::vector<int32_t> as_i32(const TensorInfo& t) {
  std::vector<int32_t> v(size_t(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype == DType::I32) {
      std::memcpy(&v[i], t.data + 4 * i, 4);
    } else {
      int64_t x;
      std::memcpy(&x, t.data + 8 * i, 8);
      v[i] = (x >= -2147483647 - 1 && x <= 2147483647) ? int32_t(x) : int32_t(-2147483647 - 1);
    }
  }
  return v;
}

int run_rank(const ep::RankEnv& env, const Args& args) {
  const std::string model = args.require("model"), input = args.require("input"), output = args.require("output");
  const int layer = int(args.get_int("layer", -1));
  NVFP4_CHECK(!args.has("static-input-scales"),
              "--static-input-scales is not supported with --ep on cuda yet (each rank loads only its experts)");
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

  const SafetensorsFile in(input);
  const TensorInfo* xi = in.find("hidden_states");
  NVFP4_CHECK(xi && xi->shape.size() == 2 && xi->shape[1] == H, input,
              ": hidden_states [T, H=", H, "] (bf16 or f32) is required");
  const int64_t T = xi->shape[0];
  const int64_t b = ep_token_begin(T, R, me), e = ep_token_begin(T, R, me + 1), n = e - b;
  const std::vector<float> x_all = xi->to_f32();
  const std::vector<float> x(x_all.begin() + b * H, x_all.begin() + e * H);
  std::vector<int32_t> ids(size_t(n * k));
  std::vector<float> wts(size_t(n * k));
  const TensorInfo* ti = in.find("topk_ids");
  const TensorInfo* tw = in.find("topk_weights");
  NVFP4_CHECK(!ti == !tw, input, ": topk_ids and topk_weights must be given together");
  if (ti) {
    NVFP4_CHECK(ti->shape == std::vector<int64_t>({T, k}) && tw->shape == std::vector<int64_t>({T, k}) &&
                    (ti->dtype == DType::I32 || ti->dtype == DType::I64) && tw->dtype == DType::F32,
                input, ": topk_ids must be int32/int64 [T, k] and topk_weights f32 [T, k], T=", T, " k=", k);
    const std::vector<int32_t> all = as_i32(*ti);
    const std::vector<float> allw = tw->to_f32();
    std::copy(all.begin() + b * k, all.begin() + e * k, ids.begin());
    std::copy(allw.begin() + b * k, allw.begin() + e * k, wts.begin());
  } else {
    // The router on the token's rank (host; the same math as the GPU router).
    std::vector<int64_t> tid;
    if (const TensorInfo* t = in.find("token_ids")) {
      const std::vector<int32_t> all = as_i32(*t);
      NVFP4_CHECK(int64_t(all.size()) == T, input, ": token_ids must be [T=", T, "]");
      tid.assign(all.begin() + b, all.begin() + e);
    }
    NVFP4_CHECK(!cfg.hash_routed || !tid.empty() || T == 0, input, ": layer ", layer,
                " is hash-routed: tensor \"token_ids\" [T] is required (or topk_ids + topk_weights)");
    cpu::route_tokens(cfg, w.router, x.data(), n, tid.empty() ? nullptr : tid.data(), ids.data(), wts.data(), 0);
  }
  ep::NcclComm comm(env);
  EpCudaOptions o;
  o.max_tokens_per_rank = std::max<int64_t>(1, ep_token_begin(T, R, 1));  // the largest chunk
  o.checked = true;
  NcclEpMoe moe(comm.get(), w, o);
  const std::vector<float> y = moe.forward_host({.x = x, .tokens = n, .topk_ids = ids, .topk_weights = wts}).y;
  std::vector<uint16_t> yb(y.size());
  for (size_t i = 0; i < y.size(); ++i) yb[i] = bf16_from_float(y[i]).bits;
  SafetensorsWriter part;
  part.add("output", DType::BF16, {n, H}, yb.data());
  part.add("topk_ids", DType::I32, {n, k}, ids.data());
  part.add("topk_weights", DType::F32, {n, k}, wts.data());
  part.write(part_path(output, me));
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
  Args args(argc, argv, {"help", "graph", "unbounded"});
  args.allow_only({"help", "ep", "model", "experts", "tokens", "iters", "warmup", "seed", "device", "workload", "combine",
                   "graph", "max-tokens", "unbounded"});
  const int R = int(args.get_int("ep", 1));
  NVFP4_CHECK(R >= 1 && R <= 64, "--ep: rank count must be in [1, 64], got ", R);
  if (const auto env = ep::rank_env()) return bench_rank(*env, args);
  NVFP4_CHECK(nccl_ep_available(), "--ep ", R, " on GPUs needs NCCL: this build has none (-DNCCL_ROOT=<dir>)");
  return ep::launch_ranks(R, relaunch_args("bench", argc, argv));
}

int cmd_run_ep_cuda(int argc, char** argv) {
  Args args(argc, argv, {"help", "static-input-scales"});
  const int R = int(args.get_int("ep", 1));
  NVFP4_CHECK(R >= 1 && R <= 64, "--ep: rank count must be in [1, 64], got ", R);
  NVFP4_CHECK(args.has("layer") && args.get_int("layer", -1) >= 0, "--layer: a layer index >= 0 is required");
  if (const auto env = ep::rank_env()) return run_rank(*env, args);
  NVFP4_CHECK(nccl_ep_available(), "--ep ", R, " on GPUs needs NCCL: this build has none (-DNCCL_ROOT=<dir>)");
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
