// Per-token router math of the DeepSeek-V4 MoE (docs/numerics.md §5), one header
// compiled by the CPU backend and by CUDA kernels so that both select the SAME
// experts with the SAME weights, bit for bit.
//
// Why everything here is defined so precisely: top-k selection is discrete, so
// a one-ulp difference in a logit can swap two nearly tied experts. The rules:
//   * logit l_e = x . Wg_e: each product x_i * Wg_ei is an exact FP32 product
//     (both operands as floats), the products are summed in DOUBLE and the sum
//     is rounded to float ONCE. A double sum of ~7168 float products is exact
//     to ~1e-16 relative, so any summation order (serial, tree, warp shuffle)
//     rounds to the same float except in astronomically rare cases.
//   * score s_e is computed from that float logit in double and rounded to
//     float once (sqrt(softplus) through double log1p/exp: CPU libm and CUDA
//     agree to well under half a float ulp, so the float rounding matches).
//   * selection key = s_e + b_e in float; larger wins; equal keys -> lower
//     expert id; NaN keys count as -inf (a NaN token then selects the lowest
//     ids, and its NaN weights make only its own output NaN).
//   * weights: w_j = rho * s_j / sum_j' s_j' with the sum over the selected
//     slots in slot order, in double, rounded to float once.
#pragma once

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define NVFP4_ROUTER_HD __host__ __device__ __forceinline__
#else
#define NVFP4_ROUTER_HD inline
#endif

namespace nvfp4moe::router {

// Scoring functions (the values of nvfp4moe::Scoring, kept as ints so this
// header does not depend on the public API).
enum ScoringKind : int { kSqrtSoftplus = 0, kSigmoid = 1, kSoftmax = 2 };

// softplus(z) = log1p(exp(z)), = z for z > 20 (docs/numerics.md §5), in double.
NVFP4_ROUTER_HD double softplus(double z) { return z > 20.0 ? z : log1p(exp(z)); }

// s = sqrt(softplus(l)) rounded to float once. NaN in, NaN out.
NVFP4_ROUTER_HD float sqrt_softplus_score(float logit) {
  return float(sqrt(softplus(double(logit))));
}

// DeepSeek-V3 style sigmoid score 1 / (1 + exp(-l)), rounded to float once.
NVFP4_ROUTER_HD float sigmoid_score(float logit) { return float(1.0 / (1.0 + exp(-double(logit)))); }

// Score of one expert for the element-wise scorings (not softmax, which needs
// the whole row: see softmax_scores below).
NVFP4_ROUTER_HD float score_of(int scoring, float logit) {
  return scoring == kSigmoid ? sigmoid_score(logit) : sqrt_softplus_score(logit);
}

// Adds one exact float product to a double accumulator: the logit's building
// block. Any order of these calls gives the same float after round_logit.
NVFP4_ROUTER_HD double add_product(double acc, float x, float w) {
#if defined(__CUDA_ARCH__)
  float p = __fmul_rn(x, w);  // never contracted into an FMA
#else
  float p = x * w;  // ISO C++ mode: -ffp-contract=off, an exact IEEE float product
#endif
  return acc + double(p);
}
NVFP4_ROUTER_HD float round_logit(double acc) { return float(acc); }

// Selection key: s + b in float; NaN -> -inf so comparisons stay a total order.
NVFP4_ROUTER_HD float selection_key(float score, float bias) {
  float k = score + bias;
  return k != k ? -INFINITY : k;
}

// True if (key_a, id_a) ranks before (key_b, id_b): larger key, then lower id.
NVFP4_ROUTER_HD bool ranks_before(float key_a, int id_a, float key_b, int id_b) {
  return key_a > key_b || (key_a == key_b && id_a < id_b);
}

// Top-k by insertion into a sorted list of k entries (k is small, <= ~16):
// ids/keys are kept best first. Call with e = 0..E-1 in any order: the result
// depends only on the (key, id) pairs. `filled` counts entries so far.
NVFP4_ROUTER_HD void topk_insert(float key, int id, int k, float* keys, int* ids, int& filled) {
  if (filled == k && !ranks_before(key, id, keys[k - 1], ids[k - 1])) return;
  int pos = filled < k ? filled++ : k - 1;
  while (pos > 0 && ranks_before(key, id, keys[pos - 1], ids[pos - 1])) {
    keys[pos] = keys[pos - 1];
    ids[pos] = ids[pos - 1];
    --pos;
  }
  keys[pos] = key;
  ids[pos] = id;
}

// Routing weights of the k selected slots from their scores:
// norm_topk_prob: w_j = rho * s_j / sum s (sum in double, slot order);
// otherwise w_j = rho * s_j. Rounded to float once each.
NVFP4_ROUTER_HD void topk_weights(const float* scores, int k, float rho, bool norm_topk_prob,
                                  float* weights) {
  double sum = 0.0;
  for (int j = 0; j < k; ++j) sum += double(scores[j]);
  for (int j = 0; j < k; ++j)
    weights[j] = norm_topk_prob ? float(double(rho) * double(scores[j]) / sum)
                                : float(double(rho) * double(scores[j]));
}

// Softmax over a row of E float logits, in double, each rounded to float once
// (max-subtracted; sum in index order).
NVFP4_ROUTER_HD void softmax_scores(const float* logits, int experts, float* scores) {
  double m = -INFINITY;
  for (int e = 0; e < experts; ++e) m = double(logits[e]) > m || logits[e] != logits[e] ? double(logits[e]) : m;
  double sum = 0.0;
  for (int e = 0; e < experts; ++e) sum += exp(double(logits[e]) - m);
  for (int e = 0; e < experts; ++e) scores[e] = float(exp(double(logits[e]) - m) / sum);
}

}  // namespace nvfp4moe::router
