// An independent, deliberately simple FP64 evaluation of docs/numerics.md §5,
// the yardstick for every MoE backend: router in double, weights dequantized in
// double, QDQ of activations written out from the §2 formulas (the exact
// quantizer is called for the quantize step only), every sum in double, no
// tiling, no grouping, no threads. NVFP4 and MXFP4 experts; the activation
// modes of §7 (nvfp4, bf16, fp8) written out from their formulas.
#pragma once

#include <cstdint>
#include <vector>

#include "nvfp4moe/moe.hpp"

namespace nvfp4moe::test {

struct RefRouting {
  std::vector<int32_t> ids;       // [T, k] GLOBAL ids, best first
  std::vector<double> weights;    // [T, k]
  std::vector<double> keys;       // [T, E] selection keys s_e + b_e (scored layers)
  std::vector<double> scores;     // [T, E] s_e
};

// Router of docs/numerics.md §5 in double: l = x . Wg, s = sqrt(softplus(l)),
// top-k of s + b (ties -> lower id), or tid2eid[token_ids[t]] when hash-routed;
// w = rho * s / sum s (norm_topk_prob) or rho * s.
RefRouting reference_router_f64(const MoeWeights& w, const std::vector<float>& x, int64_t tokens,
                                const std::vector<int32_t>* token_ids = nullptr);

// y [T, H] in double for the given routing (GLOBAL ids or -1, weights as
// floats as a backend would receive them). `w.experts` must hold all experts.
//
// `near_boundary` (optional, [T]): 1 where a QDQ(h) decision of the token sat
// within 1e-5 (relative) of a rounding boundary — a block scale at an E4M3
// midpoint or a value at an E2M1 threshold. h = silu(gate) * up is computed
// in FP32 by backends (§5 allows it), so such a decision may
// legitimately go either way, and with a small I one flipped block scale
// moves y by several percent: tests may exclude those tokens.
std::vector<double> reference_moe_f64(const MoeWeights& w, const std::vector<float>& x, int64_t tokens,
                                      const std::vector<int32_t>& ids, const std::vector<float>& weights,
                                      std::vector<uint8_t>* near_boundary = nullptr);

// The shared expert's weights w1 (which = 1), w3 (3) or w2 (2), [rows, cols],
// dequantized in double: BF16 values, or FP8 e4m3 value x tile factor.
std::vector<double> shared_weights_f64(const SharedExpertWeights& s, int which, int64_t rows, int64_t cols);

// The shared expert alone in double, [T, H] (zeros when n_s == 0), BF16 or
// block-scaled FP8 weights (dequantized by shared_weights_f64).
std::vector<double> reference_shared_f64(const MoeWeights& w, const std::vector<float>& x, int64_t tokens);

}  // namespace nvfp4moe::test
