// One NVFP4 expert projection on the CPU backend's kernels, weights cold in
// memory, against the memory floor: bytes of codes + scales over the read
// bandwidth measured in the same run on the same threads (docs/performance.md,
// "CPU backend"). Each timed call uses the next of enough weight copies to
// exceed the last-level cache, so every call streams its weights from DRAM.
//
// Rows: the exact integer path (NVFP4 activations, what the forward runs) and
// the FP32 path (dequantize to FP32, FMA dots: the path of the BF16 / FP8
// activation modes, and the previous NVFP4 path).
//
// Run: nvfp4moe_cpu_projection_bench [threads] [copies_mb]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "cpu_read_bandwidth.hpp"
#include "common/worker_pool.hpp"
#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "cpu/nvfp4_int_dot.hpp"
#include "cpu/work_queue.hpp"

using namespace nvfp4moe;
using bench::Clock;

namespace {

constexpr int64_t kTile = 16;        // weight rows per kernel call, as in the routed experts
constexpr int64_t kTilesPerTake = 8;  // consecutive tiles per work item, as there

struct Matrix {
  std::vector<uint8_t> codes, scales;
};

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t copies_mb = argc > 2 ? std::atoll(argv[2]) : 1024;
  WorkerPool pool(threads);
  std::mt19937_64 rng(1);

  std::vector<uint64_t> bw_buf(size_t(copies_mb) << 17);
  for (auto& v : bw_buf) v = rng();
  const double bw = bench::read_bandwidth(pool, bw_buf);
  bw_buf = {};
  std::printf("cpu projection bench: %d threads, int-dot isa %s, fp32 isa %s, read bandwidth %.1f GB/s\n",
              pool.size(), cpu::int_dot_isa_name(cpu::int_dot_isa_best()), cpu::cpu_kernel_isa(), bw / 1e9);
  std::printf("%-11s %5s %-6s %10s %10s %10s %8s\n", "N x K", "batch", "path", "time us", "min us", "floor us",
              "x floor");

  const cpu::E2m1PairTable lut;
  const struct {
    int64_t N, K;
  } sizes[] = {{2048, 4096}, {4096, 2048}};
  for (const auto& sz : sizes) {
    const int64_t N = sz.N, K = sz.K, bytes = N * K / 2 + N * K / 16;
    const int64_t n_copies = std::max<int64_t>(2, (copies_mb << 20) / bytes);
    std::vector<Matrix> w(static_cast<size_t>(n_copies));
    for (auto& m : w) {
      m.codes.resize(size_t(N * K / 2));
      m.scales.resize(size_t(N * K / 16));
      for (auto& c : m.codes) c = uint8_t(rng());
      for (auto& s : m.scales) s = uint8_t(0x30 + rng() % 16);  // UE4M3 0.5 .. 1.9
    }
    for (const int64_t T : {1, 8, 64}) {
      std::vector<float> x(static_cast<size_t>(T * K)), values(x.size()), g(static_cast<size_t>(T));
      std::normal_distribution<float> nd;
      for (auto& v : x) v = nd(rng);
      cpu::qdq_rows(x.data(), T, K, nullptr, 0, values.data(), g.data());
      cpu::IntActRows packed;
      packed.resize(T, K);
      for (int64_t t = 0; t < T; ++t) cpu::pack_int_act_row(values.data() + t * K, K, packed, t);
      std::vector<float> out(static_cast<size_t>(T * N));
      std::vector<std::vector<float>> tiles(size_t(pool.size()), std::vector<float>(size_t(kTile * K)));
      for (const bool int_path : {true, false}) {
        // Calls spread over ~0.1 s or more, so a busy neighbour moves the median less.
        const int iters = int(std::min<int64_t>(n_copies, T == 64 ? 30 : 200));
        std::vector<double> t;
        for (int it = 0; it < iters + 1; ++it) {
          const Matrix& m = w[size_t(it % n_copies)];
          const auto t0 = Clock::now();
          // One 16-row tile, as one work item of the routed experts runs it.
          auto one_tile = [&](int64_t tile, int worker) {
            const int64_t r0 = tile * kTile, n = std::min(kTile, N - r0);
            const uint8_t* codes = m.codes.data() + r0 * (K / 2);
            const uint8_t* scales = m.scales.data() + r0 * (K / 16);
            float dots[kTile * cpu::kIntDotTokens];
            if (int_path) {
              for (int64_t t0 = 0; t0 < T; t0 += cpu::kIntDotTokens) {
                const int mm = int(std::min<int64_t>(cpu::kIntDotTokens, T - t0));
                cpu::IntActRow rows[cpu::kIntDotTokens];
                for (int i = 0; i < mm; ++i) rows[i] = packed.row(t0 + i);
                cpu::int_dot_rows_tokens(lut, rows, mm, codes, scales, n, K, dots, kTile);
                for (int i = 0; i < mm; ++i)
                  for (int64_t r = 0; r < n; ++r) out[size_t((t0 + i) * N + r0 + r)] = dots[i * kTile + r] * g[size_t(t0 + i)];
              }
            } else {
              float* tile_f = tiles[size_t(worker)].data();
              const bool fused = T <= cpu::kDotTokens;
              if (!fused) cpu::dequant_rows_noglobal(lut, codes, scales, n, K, tile_f);
              for (int64_t t0 = 0; t0 < T; t0 += cpu::kDotTokens) {
                const int mm = int(std::min<int64_t>(cpu::kDotTokens, T - t0));
                const float* a[cpu::kDotTokens];
                for (int i = 0; i < mm; ++i) a[i] = values.data() + (t0 + i) * K;
                if (fused) cpu::nvfp4_dot_rows_tokens(lut, a, mm, codes, scales, n, K, dots, kTile, tile_f);
                else cpu::dot_rows_tokens(a, mm, tile_f, n, K, dots, kTile);
                for (int i = 0; i < mm; ++i)
                  for (int64_t r = 0; r < n; ++r) out[size_t((t0 + i) * N + r0 + r)] = dots[i * kTile + r] * g[size_t(t0 + i)];
              }
            }
          };
          const int64_t n_tiles = (N + kTile - 1) / kTile;
          cpu::run_items((n_tiles + kTilesPerTake - 1) / kTilesPerTake, pool, [&](int64_t take, int worker) {
            for (int64_t i = take * kTilesPerTake; i < std::min(n_tiles, (take + 1) * kTilesPerTake); ++i)
              one_tile(i, worker);
          });
          if (it > 0) t.push_back(bench::seconds_since(t0));  // the first call warms the code and the pool
        }
        // The median is the row's time; the minimum shows what a call takes
        // when no other process shares the cores (on a busy machine a thread
        // descheduled inside its work item stalls the whole call).
        const double us = bench::median(t) * 1e6, floor_us = double(bytes) / bw * 1e6;
        const double min_us = *std::min_element(t.begin(), t.end()) * 1e6;
        std::printf("%4lld x %-4lld %5lld %-6s %10.0f %10.0f %10.0f %8.2f\n", (long long)N, (long long)K, (long long)T,
                    int_path ? "int" : "fp32", us, min_us, floor_us, us / floor_us);
      }
    }
  }
  return 0;
}
