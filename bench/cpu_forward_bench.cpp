// CPU backend forward time at DeepSeek-V4 geometries (docs/performance.md,
// "CPU backend"). Weights are random NVFP4 BYTES (codes uniform, scale bytes in a
// realistic range), not a synthetic model: the forward's time does not depend
// on the values, and generating 3.6 GB of quantized Flash weights from dense
// ones takes minutes on a small machine. The router gate is random, so
// routing is close to uniform, as with trained DeepSeek routers under load
// balancing.
//
// Built with -DNVFP4MOE_BUILD_BENCH=ON as nvfp4moe_cpu_bench.
// Run: nvfp4moe_cpu_bench [flash|pro|small] [T1,T2,...] [threads]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

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
  const int64_t E = c.experts, H = c.hidden, I = c.intermediate;

  MoeWeights w;
  w.config = c;
  ExpertWeights& x = w.experts;
  x.count = E;
  x.hidden = H;
  x.intermediate = I;
  std::mt19937_64 rng(1);
  auto fill = [&](std::vector<uint8_t>& v, size_t n, bool scale) {
    v.resize(n);
    for (size_t i = 0; i + 8 <= n; i += 8) {
      const uint64_t r = rng();
      for (int b = 0; b < 8; ++b) v[i + size_t(b)] = uint8_t(r >> (8 * b));
    }
    if (scale)
      for (auto& b : v) b = uint8_t(0x30 + (b & 0x0f));  // UE4M3 0.5 .. 1.9
  };
  fill(x.w13_codes, size_t(E * 2 * I * H / 2), false);
  fill(x.w13_scales, size_t(E * 2 * I * H / 16), true);
  fill(x.w2_codes, size_t(E * H * I / 2), false);
  fill(x.w2_scales, size_t(E * H * I / 16), true);
  x.w13_global.assign(size_t(E * 2), 1e-3f);
  x.w2_global.assign(size_t(E), 1e-3f);
  w.router.gate.resize(size_t(E * H));
  for (auto& g : w.router.gate) g = float(int(rng() % 2001) - 1000) * 1e-5f;
  const int64_t Is = c.shared_inter();
  w.shared.w1.assign(size_t(Is * H), bf16_from_float(0.01f));
  w.shared.w3 = w.shared.w1;
  w.shared.w2 = w.shared.w1;
  MoeOptions o;
  o.threads = threads;
  Moe moe(std::move(w), o);

  std::printf("%s: H=%lld I=%lld E=%lld k=%lld, %s threads\n", model.c_str(), (long long)H, (long long)I,
              (long long)E, (long long)c.top_k, threads ? std::to_string(threads).c_str() : "all");
  std::printf("%8s %8s %12s %12s %10s\n", "tokens", "experts", "wall ms", "cpu ms", "tokens/s");
  for (const int64_t T : tokens) {
    std::vector<float> in(size_t(T * H));
    for (auto& v : in) v = float(int(rng() % 2001) - 1000) * 1e-3f;
    const std::vector<int32_t> ids = moe.forward_host({.x = in, .tokens = T}).topk_ids;  // warm-up
    std::vector<bool> hit(static_cast<size_t>(E));
    for (int32_t id : ids) hit[size_t(id)] = true;
    int64_t experts = 0;
    for (bool h : hit) experts += h;
    const int iters = T <= 16 ? 5 : 2;
    const auto t0 = std::chrono::steady_clock::now();
    const std::clock_t c0 = std::clock();
    for (int i = 0; i < iters; ++i) moe.forward_host({.x = in, .tokens = T});
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
    const double cpu = double(std::clock() - c0) / CLOCKS_PER_SEC / iters;
    std::printf("%8lld %8lld %12.1f %12.1f %10.1f\n", (long long)T, (long long)experts, wall * 1e3, cpu * 1e3,
                double(T) / wall);
  }
  return 0;
}
