// The shared expert: BF16 or block-scaled FP8 weights, FP32 math on x as
// given (no QDQ), the same SwiGLU with limit as the routed experts.
//
// FP8 weights are dequantized exactly as the format defines them, one FP32
// product per element, e4m3(w[n, k]) * scale[n / 128, k / 128], and then go
// through the same dot products as BF16 weights: the two formats give equal
// results whenever their dequantized values are equal.
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "cpu/work_queue.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

namespace {

constexpr int64_t kTileRows = 16;
constexpr int64_t kFp8Tile = SharedExpertWeights::kFp8Tile;
static_assert(kFp8Tile == 128, "widen_fp8_row takes the scales of 128-column tiles");

// One projection's weights W [N, K] in either format.
struct WeightRows {
  const Bf16* bf16 = nullptr;      // BF16 [N, K], or
  const uint8_t* fp8 = nullptr;    // E4M3 bit patterns [N, K]
  const float* scale = nullptr;    // with tile scales [ceil(N/128), ceil(K/128)]
};

// Rows [n0, n0 + n) of W as FP32, the exact values every dot product uses.
void widen_rows(const E2m1PairTable& lut, const WeightRows& w, int64_t n0, int64_t n, int64_t K, float* out) {
  if (w.bf16) {
    widen_bf16(w.bf16 + n0 * K, n * K, out);
    return;
  }
  const int64_t tiles_k = (K + kFp8Tile - 1) / kFp8Tile;
  for (int64_t r = 0; r < n; ++r)
    widen_fp8_row(lut, w.fp8 + (n0 + r) * K, w.scale + ((n0 + r) / kFp8Tile) * tiles_k, K, out + r * K);
}

// out[t, n] = dot(in[t], W[n]) for all t and n, one tile of rows widened at a
// time and reused across all tokens.
void weight_gemm(const float* in, int64_t tokens, const WeightRows& W, int64_t N, int64_t K, float* out,
                 int64_t ldo, WorkerPool& pool) {
  static const E2m1PairTable lut;
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  // One widened tile per worker for the call (allocated and zero-filled per
  // item it cost more than the dots at decode: 256 KiB for 128 KiB of BF16).
  std::vector<std::vector<float>> scratch(static_cast<size_t>(item_workers(tiles, pool)));
  run_items(tiles, pool, [&](int64_t tile, int worker) {
    const int64_t n0 = tile * kTileRows, n = std::min(kTileRows, N - n0);
    std::vector<float>& wt = scratch[size_t(worker)];
    if (wt.size() < size_t(kTileRows * K)) wt.resize(size_t(kTileRows * K));
    // BF16 and few tokens: widen inside the dots; else widen the tile once.
    const bool fused = W.bf16 && tokens <= kDotTokens;
    if (!fused) widen_rows(lut, W, n0, n, K, wt.data());
    for (int64_t t0 = 0; t0 < tokens; t0 += kDotTokens) {
      const int m = int(std::min<int64_t>(kDotTokens, tokens - t0));
      const float* a[kDotTokens];
      for (int t = 0; t < m; ++t) a[t] = in + (t0 + t) * K;
      if (fused)
        bf16_dot_rows_tokens(a, m, W.bf16 + n0 * K, n, K, out + t0 * ldo + n0, ldo, wt.data());
      else
        dot_rows_tokens(a, m, wt.data(), n, K, out + t0 * ldo + n0, ldo);
    }
  });
}

}  // namespace

void run_shared_expert(const MoeConfig& cfg, const SharedExpertWeights& s, const float* x, int64_t tokens,
                       float* out, WorkerPool& pool) {
  const int64_t H = cfg.hidden, Is = cfg.shared_inter();
  s.validate(H, Is);
  if (tokens == 0) return;
  const bool fp8 = s.format == SharedExpertFormat::Fp8Block;
  auto rows = [&](const std::vector<Bf16>& b, const std::vector<uint8_t>& q, const std::vector<float>& sc) {
    return fp8 ? WeightRows{nullptr, q.data(), sc.data()} : WeightRows{b.data(), nullptr, nullptr};
  };
  std::vector<float> gate(static_cast<size_t>(tokens * Is)), up(static_cast<size_t>(tokens * Is));
  weight_gemm(x, tokens, rows(s.w1, s.w1_fp8, s.w1_scale), Is, H, gate.data(), Is, pool);
  weight_gemm(x, tokens, rows(s.w3, s.w3_fp8, s.w3_scale), Is, H, up.data(), Is, pool);
  const bool has_limit = cfg.swiglu_limit.has_value();
  const float limit = cfg.swiglu_limit.value_or(0.0f);
  for (int64_t i = 0; i < tokens * Is; ++i) gate[size_t(i)] = swiglu(gate[size_t(i)], up[size_t(i)], has_limit, limit);
  weight_gemm(gate.data(), tokens, rows(s.w2, s.w2_fp8, s.w2_scale), H, Is, out, H, pool);
}

void run_shared_expert(const MoeConfig& cfg, const SharedExpertWeights& s, const float* x, int64_t tokens,
                       float* out, int threads) {
  WorkerPool pool(threads);
  run_shared_expert(cfg, s, x, tokens, out, pool);
}

}  // namespace nvfp4moe::cpu
