// The shared expert: unquantized BF16 weights, FP32 math on x as given (no
// QDQ), the same SwiGLU with limit as the routed experts.
#include <algorithm>
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "cpu/work_queue.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

namespace {

constexpr int64_t kTileRows = 16;

// out[t, n] = dot(in[t], W[n]) for all t and n: W [N, K] BF16, widened one
// tile of rows at a time and reused across all tokens.
void bf16_gemm(const float* in, int64_t tokens, const Bf16* W, int64_t N, int64_t K, float* out, int64_t ldo,
               int threads) {
  const int64_t tiles = (N + kTileRows - 1) / kTileRows;
  run_items(tiles, threads, [&](int64_t tile, int) {
    const int64_t n0 = tile * kTileRows, n = std::min(kTileRows, N - n0);
    std::vector<float> wt(static_cast<size_t>(n * K));
    // Few tokens: widen inside the dots; more: widen the tile once.
    const bool fused = tokens <= kDotTokens;
    if (!fused) widen_bf16(W + n0 * K, n * K, wt.data());
    for (int64_t t0 = 0; t0 < tokens; t0 += kDotTokens) {
      const int m = int(std::min<int64_t>(kDotTokens, tokens - t0));
      const float* a[kDotTokens];
      for (int t = 0; t < m; ++t) a[t] = in + (t0 + t) * K;
      if (fused)
        bf16_dot_rows_tokens(a, m, W + n0 * K, n, K, out + t0 * ldo + n0, ldo, wt.data());
      else
        dot_rows_tokens(a, m, wt.data(), n, K, out + t0 * ldo + n0, ldo);
    }
  });
}

}  // namespace

void run_shared_expert(const MoeConfig& cfg, const SharedExpertWeights& s, const float* x, int64_t tokens,
                       float* out, int threads) {
  const int64_t H = cfg.hidden, Is = cfg.shared_inter();
  NVFP4_CHECK(int64_t(s.w1.size()) == Is * H && int64_t(s.w3.size()) == Is * H &&
                  int64_t(s.w2.size()) == H * Is,
              "shared expert: weights have w1=", s.w1.size(), " w3=", s.w3.size(), " w2=", s.w2.size(),
              " elements, expected [Is, H] = [", Is, ", ", H, "] and [H, Is]");
  if (tokens == 0) return;
  std::vector<float> gate(static_cast<size_t>(tokens * Is)), up(static_cast<size_t>(tokens * Is));
  bf16_gemm(x, tokens, s.w1.data(), Is, H, gate.data(), Is, threads);
  bf16_gemm(x, tokens, s.w3.data(), Is, H, up.data(), Is, threads);
  const bool has_limit = cfg.swiglu_limit.has_value();
  const float limit = cfg.swiglu_limit.value_or(0.0f);
  for (int64_t i = 0; i < tokens * Is; ++i) gate[size_t(i)] = swiglu(gate[size_t(i)], up[size_t(i)], has_limit, limit);
  bf16_gemm(gate.data(), tokens, s.w2.data(), H, Is, out, H, threads);
}

}  // namespace nvfp4moe::cpu
