// Helpers shared by the CPU, CUDA and EP MoE tests: small DeepSeek-V4-shaped
// geometries, and routing/output comparisons against the FP64 reference.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {

inline MoeConfig small_config(int64_t H, int64_t I, int64_t E, int64_t k, int64_t shared = 1) {
  MoeConfig c;
  c.hidden = H;
  c.intermediate = I;
  c.experts = E;
  c.top_k = k;
  c.shared_experts = shared;
  c.routed_scaling_factor = 1.5f;
  c.swiglu_limit = 10.0f;
  return c;
}

// Random MXFP4 experts: every code, scales 2^-(7..9) (weights of ~N(0, 1/H)
// magnitude for these H).
inline ExpertWeights random_mxfp4_experts(Rng& rng, int64_t E, int64_t H, int64_t I) {
  ExpertWeights ex;
  ex.format = ExpertFormat::Mxfp4;
  ex.count = E;
  ex.hidden = H;
  ex.intermediate = I;
  auto bytes = [&](int64_t n, bool scale) {
    std::vector<uint8_t> v(static_cast<size_t>(n));
    for (auto& b : v) b = scale ? uint8_t(118 + rng.below(3)) : uint8_t(rng.next());
    return v;
  };
  ex.w13_codes = bytes(E * 2 * I * H / 2, false);
  ex.w13_scales = bytes(E * 2 * I * H / 32, true);
  ex.w2_codes = bytes(E * H * I / 2, false);
  ex.w2_scales = bytes(E * H * I / 32, true);
  return ex;
}

inline std::string describe(const MoeConfig& c, int64_t T) {
  std::ostringstream os;
  os << "H=" << c.hidden << " I=" << c.intermediate << " E=" << c.experts << " k=" << c.top_k
     << " n_s=" << c.shared_experts << " T=" << T << (c.hash_routed ? " hash" : "")
     << (c.l1_input == InputScaleMode::Static ? " static-l1" : "")
     << (c.l2_input == InputScaleMode::Static ? " static-l2" : "");
  return os.str();
}

// Hidden states ~N(0, 1) with a few large values (real activations have them).
inline std::vector<float> random_hidden(Rng& rng, int64_t T, int64_t H) {
  std::vector<float> x = random_normal(rng, T * H);
  for (int64_t i = 0; i < T; ++i) x[size_t(rng.below(T * H))] *= 12.0f;
  return x;
}

// Every element finite (poisoned NaN outputs must all have been overwritten).
inline int64_t count_non_finite(const std::vector<float>& v) {
  int64_t n = 0;
  for (float f : v) n += !std::isfinite(f);
  return n;
}

// The backend's selection must equal the FP64 router's, except where the two
// keys it swapped are tied to within `tie` (float rounding of a near-tie).
// The weights are renormalised over the selected set, and a swapped expert's
// score can differ from the other's while their selection keys tie (the keys
// carry the bias), so a token with a swap has its weights compared only
// where its selection matches; a swap changes every weight of the token.
inline void expect_same_selection(const MoeConfig& c, const RefRouting& ref, const std::vector<int32_t>& ids,
                                  const std::vector<float>& weights, int64_t T, double tie = 1e-6) {
  const int64_t k = c.top_k, E = c.experts;
  for (int64_t t = 0; t < T; ++t) {
    bool swapped = false;
    for (int64_t j = 0; j < k; ++j) swapped = swapped || ids[size_t(t * k + j)] != ref.ids[size_t(t * k + j)];
    for (int64_t j = 0; j < k; ++j) {
      const int32_t got = ids[size_t(t * k + j)], want = ref.ids[size_t(t * k + j)];
      if (got != want) {
        ASSERT_TRUE(got >= 0 && got < E) << "token " << t << " slot " << j << " id " << got;
        const double kg = ref.keys[size_t(t * E + got)], kw = ref.keys[size_t(t * E + want)];
        EXPECT_LE(std::fabs(kg - kw), tie) << "token " << t << " slot " << j << ": selected expert " << got
                                           << " (key " << kg << "), FP64 router selected " << want << " (key "
                                           << kw << ")";
        continue;
      }
      if (swapped) continue;
      EXPECT_NEAR(weights[size_t(t * k + j)], ref.weights[size_t(t * k + j)],
                  1e-6 * std::fabs(ref.weights[size_t(t * k + j)]) + 1e-7)
          << "token " << t << " slot " << j << " expert " << got;
    }
  }
}

}  // namespace nvfp4moe::test
