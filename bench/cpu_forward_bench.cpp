// CPU backend forward time at DeepSeek-V4 geometries (docs/performance.md,
// "CPU backend"). Weights are random NVFP4 BYTES (make_random_nvfp4_moe: codes
// uniform, scale bytes in a realistic range), not a synthetic model: the
// forward's time does not depend on the values, and generating 3.6 GB of
// quantized Flash weights from dense ones takes minutes on a small machine.
// The router gate is random, so routing is close to uniform, as with trained
// DeepSeek routers under load balancing.
//
// Per T it prints the memory floor: bytes of the touched experts (codes and
// scales of W13 and W2), the shared expert and the router gate over the read
// bandwidth measured in the same run on the same number of threads, and the
// forward's wall time as a multiple of it.
//
// Each timed forward starts with its weights cold: a 1 GiB read (untimed)
// evicts them from the caches first; `warm` as the fourth argument skips it
// (the same input then finds its experts in the last-level cache).
//
// The fifth and sixth arguments pick the routed experts' format (nvfp4, or
// mxfp4: random MXFP4 bytes, read at its 4.25 bits a weight) and their
// activation mode (nvfp4, bf16, fp8: docs/numerics.md section 7).
//
// Built with -DNVFP4MOE_BUILD_BENCH=ON as nvfp4moe_cpu_bench.
// Run: nvfp4moe_cpu_bench [flash|pro|small] [T1,T2,...] [threads] [cold|warm] [nvfp4|mxfp4] [nvfp4|bf16|fp8]
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "cli/bench_weights.hpp"
#include "cpu_read_bandwidth.hpp"
#include "moe/random_weights.hpp"
#include "nvfp4moe/moe.hpp"

using namespace nvfp4moe;

int main(int argc, char** argv) {
  const std::string model = argc > 1 ? argv[1] : "flash";
  MoeConfig c = model == "pro" ? dsv4_pro_config() : model == "small" ? small_demo_config() : dsv4_flash_config();
  std::vector<int64_t> tokens = {1, 16, 128};
  if (argc > 2) {
    tokens.clear();
    for (char* p = argv[2]; *p;) {
      tokens.push_back(std::strtoll(p, &p, 10));
      if (*p == ',') ++p;
    }
  }
  const int threads = argc > 3 ? std::atoi(argv[3]) : 0;
  const bool cold = !(argc > 4 && std::string(argv[4]) == "warm");
  const ExpertFormat format = parse_format_option(argc > 5 ? argv[5] : "nvfp4");
  c.activation = parse_activation_mode(argc > 6 ? argv[6] : "nvfp4");
  const int64_t E = c.experts, H = c.hidden, I = c.intermediate;

  // MXFP4: the router and shared expert of the NVFP4 layer (made with one
  // expert), the routed experts as MXFP4 bytes.
  const bool mx = format == ExpertFormat::Mxfp4;
  MoeWeights w = make_random_nvfp4_moe(c, /*seed=*/1, 0, mx ? 1 : E);
  if (mx) w.experts = make_random_mxfp4_experts(c, /*seed=*/1, 0, E);
  const int64_t Is = c.shared_inter();
  MoeOptions o;
  o.threads = threads;
  Moe moe(std::move(w), o);
  std::mt19937_64 rng(1);  // inputs

  // The bandwidth buffer stays: reading it before each timed forward evicts
  // the weights from every cache (this machine's last-level cache can hold a
  // decode forward's 130 MiB), so every forward streams them from DRAM.
  WorkerPool flush_pool(threads);
  std::vector<uint64_t> buf(size_t(1) << 27);  // 1 GiB
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
  const double bw = bench::read_bandwidth(flush_pool, buf);
  std::atomic<uint64_t> sink{0};
  auto evict_caches = [&] {
    parallel_for(flush_pool, int64_t(buf.size()), 1 << 16,
                 [&](int64_t b, int64_t e) { sink += bench::read_words(buf.data() + b, e - b); });
  };
  const double expert_bytes = double(3 * I * H) * checkpoint_bits_per_weight(format) / 8;
  const double fixed_bytes = double(3 * Is * H * 2 + E * H * 4);  // BF16 shared expert, FP32 gate
  std::printf("%s: H=%lld I=%lld E=%lld k=%lld, %s experts, act %s, %s threads, read bandwidth %.1f GB/s, weights %s\n",
              model.c_str(), (long long)H, (long long)I, (long long)E, (long long)c.top_k, format_option_name(format),
              activation_mode_name(c.activation), threads ? std::to_string(threads).c_str() : "all", bw / 1e9,
              cold ? "cold" : "warm");
  std::printf("%8s %8s %12s %12s %10s %10s %8s\n", "tokens", "experts", "wall ms", "cpu ms", "tokens/s", "floor ms",
              "x floor");
  for (const int64_t T : tokens) {
    std::vector<float> in(size_t(T * H));
    for (auto& v : in) v = float(int(rng() % 2001) - 1000) * 1e-3f;
    const std::vector<int32_t> ids = moe.forward_host({.x = in, .tokens = T}).topk_ids;  // warm-up
    std::vector<bool> hit(static_cast<size_t>(E));
    for (int32_t id : ids) hit[size_t(id)] = true;
    int64_t experts = 0;
    for (bool h : hit) experts += h;
    const int iters = T <= 16 ? 7 : 3;
    std::vector<double> walls, cpus;
    for (int i = 0; i < iters; ++i) {
      if (cold) evict_caches();
      const auto t0 = bench::Clock::now();
      const std::clock_t c0 = std::clock();
      moe.forward_host({.x = in, .tokens = T});
      walls.push_back(bench::seconds_since(t0));
      cpus.push_back(double(std::clock() - c0) / CLOCKS_PER_SEC);
    }
    const double wall = bench::median(walls), cpu = bench::median(cpus);  // medians
    const double floor_s = (double(experts) * expert_bytes + fixed_bytes) / bw;
    std::printf("%8lld %8lld %12.1f %12.1f %10.1f %10.2f %8.2f\n", (long long)T, (long long)experts, wall * 1e3,
                cpu * 1e3, double(T) / wall, floor_s * 1e3, wall / floor_s);
  }
  return 0;
}
