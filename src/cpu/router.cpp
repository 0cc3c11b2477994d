// The DeepSeek-V4 router on the CPU (docs/numerics.md §5): logits, scores, top-k
// with the correction bias, or hash routing through tid2eid. The per-token
// math is router_math.hpp, shared with the CUDA router so both select alike.
#include <algorithm>
#include <cmath>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// GCC 12's AVX-512 headers self-initialise undefined vectors (`__Y = __Y`).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

#include "cpu/cpu_moe.hpp"
#include "cpu/work_queue.hpp"
#include "moe/router_math.hpp"
#include "nvfp4moe/error.hpp"

namespace nvfp4moe::cpu {

float router_logit(const float* x, const float* gate_row, int64_t hidden) {
  // 8 double lanes: each lane adds exact float products; any order rounds to
  // the same float (router_math.hpp explains why).
  double acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= hidden; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] = router::add_product(acc[l], x[i + l], gate_row[i + l]);
  for (; i < hidden; ++i) acc[0] = router::add_product(acc[0], x[i], gate_row[i]);
  double s = 0.0;
  for (int l = 0; l < 8; ++l) s += acc[l];
  return router::round_logit(s);
}

void router_logits_ref(const float* x, const float* gate, int64_t experts, int64_t hidden, float* out) {
  for (int64_t e = 0; e < experts; ++e) out[e] = router_logit(x, gate + e * hidden, hidden);
}

namespace {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NVFP4_ROUTER_X86 1
// router_logit for 4 gate rows at once: the same 8 double lanes (lane l adds
// the products of elements 8j + l, in j order), the same tail and final sum,
// so each logit is bit-identical; the 4 rows give 4 independent add chains.
// Each row's stream is prefetched 4 KiB ahead into L2 (see nvfp4_int_dot.cpp).
__attribute__((target("avx512f"))) void router_logits4_avx512(const float* x, const float* gate, int64_t hidden,
                                                              float* out) {
  __m512d acc[4] = {_mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd(), _mm512_setzero_pd()};
  int64_t i = 0;
  for (; i + 8 <= hidden; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    for (int r = 0; r < 4; ++r) {
      const float* w = gate + r * hidden + i;
      if ((i & 15) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + 1024), _MM_HINT_T1);
      acc[r] = _mm512_add_pd(acc[r], _mm512_cvtps_pd(_mm256_mul_ps(xv, _mm256_loadu_ps(w))));
    }
  }
  for (int r = 0; r < 4; ++r) {
    alignas(64) double lanes[8];
    _mm512_store_pd(lanes, acc[r]);
    const float* w = gate + r * hidden;
    for (int64_t j = i; j < hidden; ++j) lanes[0] = router::add_product(lanes[0], x[j], w[j]);
    double s = 0.0;
    for (int l = 0; l < 8; ++l) s += lanes[l];
    out[r] = router::round_logit(s);
  }
}
#endif

}  // namespace

void router_logits(const float* x, const float* gate, int64_t experts, int64_t hidden, float* out) {
  int64_t e = 0;
#ifdef NVFP4_ROUTER_X86
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (avx512)
    for (; e + 4 <= experts; e += 4) router_logits4_avx512(x, gate + e * hidden, hidden, out + e);
#endif
  router_logits_ref(x, gate + e * hidden, experts - e, hidden, out + e);
}

namespace {

// Score-based top-k of one token from its E logits.
void route_scored(const MoeConfig& cfg, const RouterWeights& r, const float* logits, float* scores, int32_t* ids,
                  float* weights) {
  const int E = int(cfg.experts), k = int(cfg.top_k);
  if (cfg.scoring == Scoring::Softmax) {
    router::softmax_scores(logits, E, scores);
  } else {
    const int kind = cfg.scoring == Scoring::Sigmoid ? router::kSigmoid : router::kSqrtSoftplus;
    for (int e = 0; e < E; ++e) scores[e] = router::score_of(kind, logits[e]);
  }
  float keys[64];
  int sel[64];
  int filled = 0;
  for (int e = 0; e < E; ++e)
    router::topk_insert(router::selection_key(scores[e], r.bias.empty() ? 0.0f : r.bias[size_t(e)]), e, k,
                        keys, sel, filled);
  float s[64];
  for (int j = 0; j < k; ++j) {
    ids[j] = sel[j];
    s[j] = scores[sel[j]];
  }
  router::topk_weights(s, k, cfg.routed_scaling_factor, cfg.norm_topk_prob, weights);
}

// Hash routing of one token: ids from tid2eid, weights from the scores of
// those experts (no bias).
void route_hashed(const MoeConfig& cfg, const RouterWeights& r, const float* x, int64_t token_id,
                  float* logits, float* scores, int32_t* ids, float* weights) {
  const int E = int(cfg.experts), k = int(cfg.top_k);
  const int64_t H = cfg.hidden;
  const int32_t* row = r.tid2eid.data() + token_id * k;
  float s[64];
  if (cfg.scoring == Scoring::Softmax) {
    for (int e = 0; e < E; ++e) logits[e] = router_logit(x, r.gate.data() + int64_t(e) * H, H);
    router::softmax_scores(logits, E, scores);
    for (int j = 0; j < k; ++j) s[j] = scores[row[j]];
  } else {
    const int kind = cfg.scoring == Scoring::Sigmoid ? router::kSigmoid : router::kSqrtSoftplus;
    for (int j = 0; j < k; ++j)
      s[j] = router::score_of(kind, router_logit(x, r.gate.data() + int64_t(row[j]) * H, H));
  }
  for (int j = 0; j < k; ++j) ids[j] = row[j];
  router::topk_weights(s, k, cfg.routed_scaling_factor, cfg.norm_topk_prob, weights);
}

}  // namespace

void route_tokens(const MoeConfig& cfg, const RouterWeights& r, const float* x, int64_t tokens,
                  const int64_t* token_ids, int32_t* topk_ids, float* topk_weights, WorkerPool& pool) {
  const int64_t E = cfg.experts, H = cfg.hidden, k = cfg.top_k;
  NVFP4_CHECK(k <= 64, "router: top_k ", k, " above the supported 64");
  NVFP4_CHECK(int64_t(r.gate.size()) == E * H, "router: no gate weight [E, H] = [", E, ", ", H,
              "] loaded (", r.gate.size(), " elements); pass topk_ids/topk_weights to skip the router");
  if (cfg.hash_routed) {
    NVFP4_CHECK(token_ids != nullptr, "router: layer is hash-routed, token_ids are required");
    for (int64_t t = 0; t < tokens; ++t)
      NVFP4_CHECK(token_ids[t] >= 0 && token_ids[t] < r.vocab, "router: token ", t, " has token id ",
                  token_ids[t], " outside [0, vocab=", r.vocab, ")");
  }
  if (cfg.hash_routed) {
    // ~E*H*2 flops per token: a token is worth a thread start past ~8 tokens.
    parallel_for(pool, tokens, std::max<int64_t>(1, (int64_t(1) << 22) / std::max<int64_t>(1, E * H)),
                 [&](int64_t t0, int64_t t1) {
                   std::vector<float> logits(static_cast<size_t>(E)), scores(static_cast<size_t>(E));
                   for (int64_t t = t0; t < t1; ++t)
                     route_hashed(cfg, r, x + t * H, token_ids[t], logits.data(), scores.data(), topk_ids + t * k,
                                  topk_weights + t * k);
                 });
    return;
  }
  // Logits [T, E] in items of kGateRows experts x kGateTokens tokens: at
  // decode the gate (E*H floats, read from memory) streams once over all
  // cores; an item's gate rows and tokens stay in L2. Each logit is
  // router_logit's float, whichever item computes it.
  constexpr int64_t kGateRows = 16, kGateTokens = 64;
  const int64_t row_items = (E + kGateRows - 1) / kGateRows;
  std::vector<float> logits(static_cast<size_t>(tokens * E));
  run_items(row_items * ((tokens + kGateTokens - 1) / kGateTokens), pool, [&](int64_t item, int) {
    const int64_t e0 = (item % row_items) * kGateRows, n = std::min(kGateRows, E - e0);
    const int64_t t0 = (item / row_items) * kGateTokens, t1 = std::min(tokens, t0 + kGateTokens);
    for (int64_t t = t0; t < t1; ++t)
      router_logits(x + t * H, r.gate.data() + e0 * H, n, H, logits.data() + t * E + e0);
  });
  parallel_for(pool, tokens, 64, [&](int64_t t0, int64_t t1) {
    std::vector<float> scores(static_cast<size_t>(E));
    for (int64_t t = t0; t < t1; ++t)
      route_scored(cfg, r, logits.data() + t * E, scores.data(), topk_ids + t * k, topk_weights + t * k);
  });
}

void route_tokens(const MoeConfig& cfg, const RouterWeights& r, const float* x, int64_t tokens,
                  const int64_t* token_ids, int32_t* topk_ids, float* topk_weights, int threads) {
  WorkerPool pool(threads);
  route_tokens(cfg, r, x, tokens, token_ids, topk_ids, topk_weights, pool);
}

}  // namespace nvfp4moe::cpu
