// `nvfp4moe demo`: the main job on its embedded default — a deterministic
// synthetic DeepSeek-V4-structured MoE layer, quantized to NVFP4, one forward
// of N tokens; prints the error against the unquantized layer (same routing),
// routing statistics and throughput.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "cli/args.hpp"
#include "cli/commands.hpp"
#include "cli/model_option.hpp"
#include "common/parallel.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"

#ifdef NVFP4MOE_HAS_CUDA
#include <cuda_runtime.h>

#include "cuda/cuda_check.hpp"
#endif

namespace nvfp4moe::cli {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double silu(double z) { return z / (1.0 + std::exp(-z)); }

// The unquantized layer on the same routing: routed experts with their FP32
// weights (regenerated one touched expert at a time, never all at once),
// activations unquantized, FP32 products summed in double; shared expert with
// its BF16 weights. Returns y [T, H] in double.
std::vector<double> unquantized_layer(const MoeConfig& c, uint64_t seed, const SharedExpertWeights& shared,
                                      const std::vector<float>& x, int64_t T, const std::vector<int32_t>& ids,
                                      const std::vector<float>& weights, int threads) {
  const int64_t H = c.hidden, I = c.intermediate, k = c.top_k, E = c.experts;
  const double L = c.swiglu_limit.value_or(INFINITY);
  auto swiglu = [&](double g, double u) { return silu(std::min(g, L)) * std::min(std::max(u, -L), L); };
  std::vector<double> y(static_cast<size_t>(T * H), 0.0);
  // Pairs per expert.
  std::vector<std::vector<std::pair<int64_t, int64_t>>> by_expert(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (ids[size_t(t * k + j)] >= 0) by_expert[size_t(ids[size_t(t * k + j)])].push_back({t, j});
  std::vector<double> o(static_cast<size_t>(T * k * H), 0.0);
  for (int64_t e = 0; e < E; ++e) {
    const auto& pairs = by_expert[size_t(e)];
    if (pairs.empty()) continue;
    const SyntheticExpertDense d = synthetic_expert_dense(c, seed, e);
    // Parallel over output rows (an expert has only a few tokens in decode).
    std::vector<double> h(static_cast<size_t>(I));
    for (const auto& [t, j] : pairs) {
      const float* xt = x.data() + t * H;
      parallel_for(I, 16, [&](int64_t n0, int64_t n1) {
        for (int64_t n = n0; n < n1; ++n) {
          double g = 0, u = 0;
          for (int64_t i = 0; i < H; ++i) {
            g += double(xt[i]) * d.w1[size_t(n * H + i)];
            u += double(xt[i]) * d.w3[size_t(n * H + i)];
          }
          h[size_t(n)] = swiglu(g, u);
        }
      }, threads);
      double* ot = o.data() + (t * k + j) * H;
      parallel_for(H, 16, [&](int64_t m0, int64_t m1) {
        for (int64_t m = m0; m < m1; ++m) {
          double acc = 0;
          for (int64_t n = 0; n < I; ++n) acc += h[size_t(n)] * d.w2[size_t(m * I + n)];
          ot[m] = double(weights[size_t(t * k + j)]) * acc;
        }
      }, threads);
    }
  }
  const int64_t Is = c.shared_inter();
  parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
    std::vector<double> h(static_cast<size_t>(Is));
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x.data() + t * H;
      if (c.shared_experts > 0) {
        for (int64_t n = 0; n < Is; ++n) {
          double g = 0, u = 0;
          for (int64_t i = 0; i < H; ++i) {
            g += double(xt[i]) * bf16_to_float(shared.w1[size_t(n * H + i)]);
            u += double(xt[i]) * bf16_to_float(shared.w3[size_t(n * H + i)]);
          }
          h[size_t(n)] = swiglu(g, u);
        }
      }
      for (int64_t m = 0; m < H; ++m) {
        double acc = 0;
        if (c.shared_experts > 0)
          for (int64_t n = 0; n < Is; ++n) acc += h[size_t(n)] * bf16_to_float(shared.w2[size_t(m * Is + n)]);
        for (int64_t j = 0; j < k; ++j) acc += o[size_t((t * k + j) * H + m)];
        y[size_t(t * H + m)] = acc;
      }
    }
  }, threads);
  return y;
}

void print_usage() {
  std::printf(
      "usage: nvfp4moe demo [--model small|dsv4-flash|dsv4-pro] [--tokens N[,N2,...]] [--device cpu|cuda]\n"
      "                     [--threads N] [--seed S] [--iters N] [--no-reference]\n"
      "Runs a deterministic synthetic DeepSeek-V4 MoE layer quantized to NVFP4: one warm-up and\n"
      "--iters timed forwards of N tokens; prints the relative error against the unquantized layer\n"
      "(same routing), routing statistics and throughput. Default: the small geometry, on cuda when a\n"
      "GPU is present, else cpu; 64 tokens. On the GPU the experts are drawn and quantized on the\n"
      "device and each forward is also timed with x and y on the device; dsv4-pro on the host takes\n"
      "minutes. The reference regenerates the touched experts on the host (--no-reference skips it).\n");
}

#ifdef NVFP4MOE_HAS_CUDA
// Device time of one forward (router included) with x and y already on the
// device: the median of `iters`, between two events on the layer's stream.
double device_forward_ms(Moe& moe, const std::vector<float>& x, int64_t T, int64_t iters) {
  const int64_t H = moe.config().hidden;
  const int device = moe.device_index();
  cuda::DeviceGuard guard(device);
  cuda::DeviceBuffer<float> dx(x.size());
  cuda::DeviceBuffer<uint16_t> dy(x.size());
  cuda::CudaStream stream;
  dx.upload(x.data(), x.size(), stream.get());  // on the forward's stream: ordered before it
  cuda::CudaEvent a, b;
  ForwardOutputs out;
  out.y = make_view(dy.get(), DType::BF16, {T, H}, DeviceKind::Cuda, device);
  const TensorView xv = make_view(dx.get(), DType::F32, {T, H}, DeviceKind::Cuda, device);
  std::vector<float> ms;
  for (int64_t i = 0; i <= iters; ++i) {  // the first is a warm-up
    NVFP4_CUDA_CHECK(cudaEventRecord(a.get(), stream.get()));
    moe.forward(xv, RoutingArgs{}, out, ForwardOptions{.stream = stream.get()});
    NVFP4_CUDA_CHECK(cudaEventRecord(b.get(), stream.get()));
    NVFP4_CUDA_CHECK(cudaEventSynchronize(b.get()));
    float t = 0;
    NVFP4_CUDA_CHECK(cudaEventElapsedTime(&t, a.get(), b.get()));
    if (i > 0) ms.push_back(t);
  }
  moe.sync_errors();
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}
#endif

// One row count's forwards: a warm-up, `iters` timed ones, routing
// statistics and (unless skipped) the error against the unquantized layer.
// Returns the number of non-finite outputs.
int64_t demo_forward(Moe& moe, const MoeConfig& cfg, const SharedExpertWeights& shared, uint64_t seed, int64_t T,
                     int64_t iters, int threads, bool gpu, bool reference) {
  std::printf("--- %lld tokens\n", (long long)T);
  const std::vector<float> x = synthetic_hidden_states(cfg, seed + 1, T);
  auto t0 = Clock::now();
  HostResult r = moe.forward_host({.x = x, .tokens = T});
  const double first = seconds_since(t0);
  t0 = Clock::now();
  const std::clock_t c0 = std::clock();
  for (int64_t i = 0; i < iters; ++i) r = moe.forward_host({.x = x, .tokens = T});
  const double per = seconds_since(t0) / double(iters);
  const double cpu_per = double(std::clock() - c0) / CLOCKS_PER_SEC / double(iters);

  std::vector<int64_t> per_expert(static_cast<size_t>(cfg.experts), 0);
  for (int32_t id : r.topk_ids)
    if (id >= 0) ++per_expert[size_t(id)];
  int64_t hit = 0, lo = INT64_MAX, hi = 0;
  for (int64_t n : per_expert) {
    hit += n > 0;
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  std::printf("routing: %lld of %lld experts hit; tokens per expert min %lld / mean %.2f / max %lld\n",
              (long long)hit, (long long)cfg.experts, (long long)lo, double(T * cfg.top_k) / double(cfg.experts),
              (long long)hi);
  int64_t nonfinite = 0;
  for (float v : r.y) nonfinite += !std::isfinite(v);
  std::printf("forward: first %.2f ms, then %.2f ms per forward (mean of %lld; %.2f ms of process CPU time) = "
              "%.1f tokens/s%s\n",
              first * 1e3, per * 1e3, (long long)iters, cpu_per * 1e3, double(T) / per,
              gpu ? " (host copies included)" : "");
#ifdef NVFP4MOE_HAS_CUDA
  if (gpu) {
    const double dev = device_forward_ms(moe, x, T, iters);
    std::printf("device time: %.3f ms per forward with x and y on the device (median of %lld) = %.1f tokens/s\n",
                dev, (long long)iters, double(T) / (dev * 1e-3));
  }
#endif
  if (!reference) return nonfinite;
  t0 = Clock::now();
  const std::vector<double> ref = unquantized_layer(cfg, seed, shared, x, T, r.topk_ids, r.topk_weights, threads);
  double num = 0, den = 0;
  for (size_t i = 0; i < r.y.size(); ++i) {
    num += (double(r.y[i]) - ref[i]) * (double(r.y[i]) - ref[i]);
    den += ref[i] * ref[i];
  }
  std::printf("relative L2 error vs the unquantized layer (same routing, %lld touched experts regenerated in "
              "%.2f s): %.4f\n",
              (long long)hit, seconds_since(t0), std::sqrt(num / std::max(den, 1e-300)));
  return nonfinite;
}

}  // namespace

int cmd_demo(int argc, char** argv) {
  const Args args(argc, argv,
                  {flag("help"), choice("model", {"small", "dsv4-flash", "dsv4-pro"}),
                   int_list("tokens", 1, kMaxTokens), choice("device", {"cpu", "cuda"}),
                   integer("threads", 1, kMaxThreads), integer("seed", 0, kMaxSeed), integer("iters", 1, kMaxIters),
                   flag("no-reference")});
  if (args.has("help")) {
    print_usage();
    return 0;
  }
  const bool gpu = args.value("device") ? parse_backend(*args.value("device")) == Backend::Cuda : cuda_available();
  // The small geometry by default everywhere: the full layers take minutes
  // of host-side generation (measured: over 170 s for dsv4-pro on 16 cores)
  // and of the host reference.
  const std::string model = args.get("model", "small");
  const MoeConfig cfg = model_option_config(model);
  // --tokens N or a list N1,N2,...: one forward (plus timed repeats) per count.
  const std::vector<int64_t> token_counts = args.get_int_list("tokens", "64");
  const int threads = int(args.get_int("threads", 0));  // 0: every core
  const uint64_t seed = uint64_t(args.get_int("seed", 2026));
  const int64_t iters = args.get_int("iters", 3);

  std::printf("nvfp4moe demo: %s  H=%lld I=%lld E=%lld top-%lld shared=%lld rho=%.2f limit=%.1f\n", model.c_str(),
              (long long)cfg.hidden, (long long)cfg.intermediate, (long long)cfg.experts, (long long)cfg.top_k,
              (long long)cfg.shared_experts, cfg.routed_scaling_factor, cfg.swiglu_limit.value_or(0.0f));
  std::printf("device %s, %d threads, seed %llu\n", gpu ? "cuda" : "cpu", thread_count(threads),
              (unsigned long long)seed);

  // On the GPU the routed experts are drawn and quantized there (the same
  // bytes as on the host, in seconds rather than minutes for dsv4-pro).
  const auto t0 = Clock::now();
  MoeWeights weights = gpu ? make_synthetic_moe_cuda(cfg, seed) : make_synthetic_moe(cfg, seed);
  const double nvfp4_gb = double(weights.experts.w13_codes.size() + weights.experts.w13_scales.size() +
                                 weights.experts.w2_codes.size() + weights.experts.w2_scales.size()) / 1e9;
  std::printf("synthetic weights quantized to NVFP4 on the %s in %.2f s (%.3f GB of routed experts)\n",
              gpu ? "device" : "host", seconds_since(t0), nvfp4_gb);
  const auto t1 = Clock::now();
  const SharedExpertWeights shared = weights.shared;
  MoeOptions opt;
  opt.backend = gpu ? Backend::Cuda : Backend::Cpu;
  opt.threads = threads;
  opt.max_tokens = std::max<int64_t>(opt.max_tokens, *std::max_element(token_counts.begin(), token_counts.end()));
  Moe moe(std::move(weights), opt);
  std::printf("layer built on the %s in %.2f s\n", gpu ? "device" : "host", seconds_since(t1));

  int64_t nonfinite = 0;
  for (const int64_t T : token_counts)
    nonfinite += demo_forward(moe, cfg, shared, seed, T, iters, threads, gpu, !args.has("no-reference"));
  if (nonfinite) std::printf("WARNING: %lld non-finite outputs\n", (long long)nonfinite);
  return nonfinite ? 1 : 0;
}

}  // namespace nvfp4moe::cli
