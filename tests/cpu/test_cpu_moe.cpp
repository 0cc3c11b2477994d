// The CPU backend against the FP64 evaluation of docs/numerics.md §5, on fresh
// random inputs: several geometries, T from 1 to 512, every routing mode.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

struct Geometry {
  int64_t H, I, E, k, shared;
};
// Square-ish, I != H both ways, k = 1, E = k, no shared expert.
const Geometry kGeometries[] = {
    {64, 32, 8, 2, 1}, {128, 64, 16, 4, 1}, {96, 160, 12, 1, 0}, {64, 48, 4, 4, 1}, {256, 128, 32, 6, 1}};

// Runs Moe::forward on poisoned outputs; returns y as floats, ids, weights.
struct ForwardRun {
  std::vector<float> y;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
ForwardRun run_forward(Moe& moe, const std::vector<float>& x, int64_t T, const std::vector<int32_t>* topk_ids = nullptr,
                const std::vector<float>* topk_weights = nullptr, const std::vector<int32_t>* token_ids = nullptr) {
  const MoeConfig& c = moe.config();
  const int64_t H = c.hidden, k = c.top_k;
  std::vector<Bf16> y(size_t(T * H), Bf16{kPoisonBf16});
  ForwardRun r;
  r.ids.assign(size_t(T * k), -7);
  r.weights.assign(size_t(T * k), NAN);
  RoutingArgs ra;
  if (topk_ids) {
    ra.topk_ids = make_view(const_cast<int32_t*>(topk_ids->data()), DType::I32, {T, k});
    ra.topk_weights = make_view(const_cast<float*>(topk_weights->data()), DType::F32, {T, k});
  }
  if (token_ids) ra.token_ids = make_view(const_cast<int32_t*>(token_ids->data()), DType::I32, {T});
  ForwardOutputs out;
  out.y = make_view(y.data(), DType::BF16, {T, H});
  out.topk_ids = make_view(r.ids.data(), DType::I32, {T, k});
  out.topk_weights = make_view(r.weights.data(), DType::F32, {T, k});
  moe.forward(make_view(const_cast<float*>(x.data()), DType::F32, {T, H}), ra, out);
  r.y.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) r.y[i] = bf16_to_float(y[i]);
  return r;
}

void check_against_reference(const MoeWeights& w, const std::vector<float>& x, int64_t T, const ForwardRun& r) {
  EXPECT_EQ(count_non_finite(r.y), 0) << "outputs not written or not finite";
  std::vector<uint8_t> near;
  const std::vector<double> ref = reference_moe_f64(w, x, T, r.ids, r.weights, &near);
  double err = rel_l2(r.y, ref);
  if (err > 1e-2) {
    // A QDQ(h) decision at a rounding boundary may go either way (see
    // reference_moe_f64): judge the other tokens, and only if few were near.
    const int64_t H = w.config.hidden;
    std::vector<float> ys;
    std::vector<double> rs;
    int64_t excluded = 0;
    for (int64_t t = 0; t < T; ++t) {
      if (near[size_t(t)]) {
        ++excluded;
        continue;
      }
      ys.insert(ys.end(), r.y.begin() + t * H, r.y.begin() + (t + 1) * H);
      rs.insert(rs.end(), ref.begin() + t * H, ref.begin() + (t + 1) * H);
    }
    if (excluded > 0 && excluded <= std::max<int64_t>(1, T / 50)) {
      std::printf("note: %lld of %lld tokens had a QDQ(h) decision at a rounding boundary (error with them %g)\n",
                  (long long)excluded, (long long)T, err);
      err = ys.empty() ? 0.0 : rel_l2(ys, rs);
    }
  }
  if (err > 1e-2) {  // name the worst token, to tell a local flip from a systematic error
    const int64_t H = w.config.hidden, k = w.config.top_k;
    int64_t worst = 0;
    double worst_err = -1;
    for (int64_t t = 0; t < T; ++t) {
      const std::vector<float> yt(r.y.begin() + t * H, r.y.begin() + (t + 1) * H);
      const std::vector<double> rt(ref.begin() + t * H, ref.begin() + (t + 1) * H);
      const double e = rel_l2(yt, rt);
      if (e > worst_err) worst_err = e, worst = t;
    }
    std::string ids;
    for (int64_t j = 0; j < k; ++j) ids += std::to_string(r.ids[size_t(worst * k + j)]) + " ";
    ADD_FAILURE() << "relative L2 error of y against FP64 " << err << " > 1e-2; worst token " << worst
                  << " (error " << worst_err << ", experts " << ids << ")";
  }
  ::testing::Test::RecordProperty("rel_l2", std::to_string(err));
}

TEST(CpuMoe, MatchesF64AcrossGeometriesAndTokenCounts) {
  const uint64_t seed = fresh_seed();
  for (const Geometry& g : kGeometries) {
    for (int64_t T : {1, 3, 64, 512}) {
      MoeConfig c = small_config(g.H, g.I, g.E, g.k, g.shared);
      SCOPED_TRACE(::testing::Message() << "seed=" << seed << " " << describe(c, T));
      Rng rng(seed ^ uint64_t(g.H * 131 + g.E * 7 + T));
      const MoeWeights w = make_synthetic_moe(c, rng.next());
      const std::vector<float> x = random_hidden(rng, T, g.H);
      Moe moe(w, MoeOptions{});
      const ForwardRun r = run_forward(moe, x, T);
      expect_same_selection(c, reference_router_f64(w, x, T), r.ids, r.weights, T);
      check_against_reference(w, x, T, r);
    }
  }
}

TEST(CpuMoe, SelectionAndWeightsMatchF64RouterForLargerE) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(512, 64, 256, 6);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 64;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  Moe moe(w, MoeOptions{});
  const ForwardRun r = run_forward(moe, x, T);
  expect_same_selection(c, reference_router_f64(w, x, T), r.ids, r.weights, T);
}

TEST(CpuMoe, NormTopkProbFalseAndSigmoidScoring) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  for (Scoring s : {Scoring::SqrtSoftplus, Scoring::Sigmoid, Scoring::Softmax}) {
    MoeConfig c = small_config(64, 32, 16, 4);
    c.norm_topk_prob = s != Scoring::SqrtSoftplus;
    c.scoring = s;
    Rng rng(seed + int(s));
    const MoeWeights w = make_synthetic_moe(c, rng.next());
    const int64_t T = 32;
    const std::vector<float> x = random_hidden(rng, T, c.hidden);
    Moe moe(w, MoeOptions{});
    const ForwardRun r = run_forward(moe, x, T);
    SCOPED_TRACE(::testing::Message() << "scoring " << int(s));
    expect_same_selection(c, reference_router_f64(w, x, T), r.ids, r.weights, T);
    check_against_reference(w, x, T, r);
  }
}

TEST(CpuMoe, HashRoutedLayerUsesTid2eid) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(64, 32, 8, 3);
  c.hash_routed = true;
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 40;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  std::vector<int32_t> tok(static_cast<size_t>(T));
  for (auto& t : tok) t = int32_t(rng.below(w.router.vocab));
  Moe moe(w, MoeOptions{});
  const ForwardRun r = run_forward(moe, x, T, nullptr, nullptr, &tok);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < c.top_k; ++j)
      ASSERT_EQ(r.ids[size_t(t * c.top_k + j)], w.router.tid2eid[size_t(tok[size_t(t)] * c.top_k + j)])
          << "token " << t << " slot " << j;
  const RefRouting ref = reference_router_f64(w, x, T, &tok);
  // The tolerance of expect_same_selection: the float logit's rounding is an
  // absolute error, and for a very negative logit it becomes ~1e-6 relative
  // in sqrt(softplus) (a weight of 8e-8 was off by 1.15e-6 of itself).
  for (size_t i = 0; i < r.weights.size(); ++i)
    EXPECT_NEAR(r.weights[i], ref.weights[i], 1e-6 * std::fabs(ref.weights[i]) + 1e-7) << "slot " << i;
  check_against_reference(w, x, T, r);
}

TEST(CpuMoe, CallerRoutingWithMinusOneSlots) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(128, 64, 16, 4);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 24, k = c.top_k;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = rng.below(4) == 0 ? -1 : int32_t(rng.below(c.experts));  // repeats allowed
    wts[i] = rng.uniform(0.1f, 1.0f);
  }
  for (int64_t j = 0; j < k; ++j) ids[size_t(5 * k + j)] = -1;  // token 5: only the shared expert
  Moe moe(w, MoeOptions{});
  const ForwardRun r = run_forward(moe, x, T, &ids, &wts);
  EXPECT_EQ(r.ids, ids) << "caller routing must be echoed";
  check_against_reference(w, x, T, r);
  // Token 5 is exactly BF16(shared(x_5)) of an all-shared run: compare with FP64 shared.
  const std::vector<double> shared = reference_shared_f64(w, x, T);
  std::vector<float> y5(r.y.begin() + 5 * c.hidden, r.y.begin() + 6 * c.hidden);
  std::vector<double> s5(shared.begin() + 5 * c.hidden, shared.begin() + 6 * c.hidden);
  EXPECT_LE(rel_l2(y5, s5), 1e-2);
}

TEST(CpuMoe, StaticInputScales) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  for (int mode = 0; mode < 3; ++mode) {
    MoeConfig c = small_config(128, 96, 8, 2);
    c.l1_input = mode != 1 ? InputScaleMode::Static : InputScaleMode::Dynamic;
    c.l2_input = mode != 0 ? InputScaleMode::Static : InputScaleMode::Dynamic;
    Rng rng(seed + uint64_t(mode));
    const MoeWeights w = make_synthetic_moe(c, rng.next());
    const int64_t T = 33;
    const std::vector<float> x = random_normal(rng, T * c.hidden);
    Moe moe(w, MoeOptions{});
    SCOPED_TRACE(describe(c, T));
    const ForwardRun r = run_forward(moe, x, T);
    check_against_reference(w, x, T, r);
    // The static scale really is used: dynamic on the same input differs.
    MoeWeights wd = w;
    wd.config.l1_input = wd.config.l2_input = InputScaleMode::Dynamic;
    Moe dyn(wd, MoeOptions{});
    EXPECT_NE(run_forward(dyn, x, T).y, r.y);
  }
}

TEST(CpuMoe, NanInOneTokenAffectsOnlyThatToken) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(64, 32, 8, 2);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 16, H = c.hidden;
  std::vector<float> x = random_hidden(rng, T, H);
  Moe moe(w, MoeOptions{});
  const ForwardRun clean = run_forward(moe, x, T);
  for (float bad : {NAN, INFINITY}) {
    std::vector<float> xb = x;
    xb[size_t(7 * H + 3)] = bad;
    const ForwardRun r = run_forward(moe, xb, T);
    int64_t nan7 = 0;
    for (int64_t i = 0; i < H; ++i) nan7 += std::isnan(r.y[size_t(7 * H + i)]);
    EXPECT_GT(nan7, 0) << "token 7 holds " << bad << " and must come out NaN";
    for (int64_t t = 0; t < T; ++t) {
      if (t == 7) continue;
      for (int64_t i = 0; i < H; ++i)
        ASSERT_EQ(r.y[size_t(t * H + i)], clean.y[size_t(t * H + i)]) << "token " << t << " element " << i;
    }
  }
  // With caller routing too (the router's NaN weights are not what carries it).
  std::vector<int32_t> ids = clean.ids;
  std::vector<float> wts = clean.weights;
  std::vector<float> xb = x;
  xb[size_t(2 * H)] = NAN;
  const ForwardRun r = run_forward(moe, xb, T, &ids, &wts);
  EXPECT_TRUE(std::isnan(r.y[size_t(2 * H + 5)]));
  EXPECT_EQ(r.y[size_t(3 * H + 5)], clean.y[size_t(3 * H + 5)]);
}

TEST(CpuMoe, Bf16InputAndInt64IdsAndThreadCountsAgreeBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(128, 64, 16, 4);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 50, H = c.hidden, k = c.top_k;
  std::vector<float> x = random_hidden(rng, T, H);
  std::vector<Bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    xb[i] = bf16_from_float(x[i]);
    x[i] = bf16_to_float(xb[i]);
  }
  MoeOptions one;
  one.threads = 1;
  Moe m1(w, one), m2(w, MoeOptions{});
  const ForwardRun a = run_forward(m1, x, T);
  const ForwardRun b = run_forward(m2, x, T);
  EXPECT_EQ(a.y, b.y) << "results must not depend on the thread count";
  EXPECT_EQ(a.ids, b.ids);
  // bf16 x and int64 caller ids give the same bits.
  std::vector<int64_t> ids64(a.ids.begin(), a.ids.end());
  std::vector<Bf16> y(size_t(T * H), Bf16{kPoisonBf16});
  RoutingArgs ra;
  ra.topk_ids = make_view(ids64.data(), DType::I64, {T, k});
  ra.topk_weights = make_view(const_cast<float*>(a.weights.data()), DType::F32, {T, k});
  ForwardOutputs out;
  out.y = make_view(y.data(), DType::BF16, {T, H});
  m2.forward(make_view(xb.data(), DType::BF16, {T, H}), ra, out);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_EQ(bf16_to_float(y[i]), a.y[i]) << "element " << i;
}

TEST(CpuMoe, ZeroTokensIsANoOp) {
  MoeConfig c = small_config(64, 32, 8, 2);
  Moe moe(make_synthetic_moe(c, 1), MoeOptions{});
  EXPECT_TRUE(moe.forward_host({.x = {}, .tokens = 0}).y.empty());
}

TEST(CpuMoe, ForwardHostMatchesForward) {
  MoeConfig c = small_config(64, 32, 8, 2);
  const MoeWeights w = make_synthetic_moe(c, 99);
  Rng rng(5);
  const int64_t T = 9;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  Moe moe(w, MoeOptions{});
  const HostResult h = moe.forward_host({.x = x, .tokens = T});
  const std::vector<float>& y = h.y;
  const std::vector<int32_t>& ids = h.topk_ids;
  const std::vector<float>& wts = h.topk_weights;
  const ForwardRun r = run_forward(moe, x, T);
  EXPECT_EQ(y, r.y);
  EXPECT_EQ(ids, r.ids);
  EXPECT_EQ(wts, r.weights);
}

}  // namespace
}  // namespace nvfp4moe::test
