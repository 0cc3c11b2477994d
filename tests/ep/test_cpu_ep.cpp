// Expert parallelism on the CPU (docs/numerics.md §6): R logical ranks must give
// what one rank gives, whatever the routing; capacity and bad ids are errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ep/cpu_ep_plan.hpp"
#include "nvfp4moe/ep.hpp"
#include "nvfp4moe/error.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(CpuEp, RanksHoldOnlyTheirSliceWithLocalIndexing) {
  MoeConfig c = small_config(64, 32, 16, 4);
  const MoeWeights w = make_synthetic_moe(c, 3);
  CpuEpMoe ep(w, 4);
  ASSERT_EQ(ep.ranks(), 4);
  for (int r = 0; r < 4; ++r) {
    const ExpertWeights& s = ep.rank_experts(r);
    EXPECT_EQ(s.count, 4);
    EXPECT_EQ(s.first_expert, 4 * r);
    // Local expert 1 of rank r is global expert 4r + 1.
    const int64_t bytes = 2 * c.intermediate * c.hidden / 2;
    EXPECT_TRUE(std::equal(s.w13_codes.begin() + bytes, s.w13_codes.begin() + 2 * bytes,
                           w.experts.w13_codes.begin() + (4 * r + 1) * bytes));
    EXPECT_EQ(s.w2_global[1], w.experts.w2_global[size_t(4 * r + 1)]);
  }
}

TEST(CpuEp, AnyRankCountEqualsOneRankBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(128, 64, 16, 4);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 37;  // not a multiple of R: uneven chunks, some empty at R=8 for small T
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  Moe single(w, MoeOptions{});
  const HostResult one = single.forward_host({.x = x, .tokens = T});
  for (int R : {1, 2, 4, 8}) {
    SCOPED_TRACE(::testing::Message() << "R=" << R);
    CpuEpMoe ep(w, R);
    const HostResult r = ep.forward_host({.x = x, .tokens = T});
    EXPECT_EQ(r.topk_ids, one.topk_ids) << "selection must be identical";
    EXPECT_EQ(r.topk_weights, one.topk_weights);
    EXPECT_EQ(r.y, one.y) << "R ranks must give the bits of one rank";
    int64_t received = 0;
    for (int64_t n : ep.last_stats().received) received += n;
    EXPECT_EQ(received, T * c.top_k);
  }
  // And the FP64 evaluation agrees with all of them.
  EXPECT_LE(rel_l2(one.y, reference_moe_f64(w, x, T, one.topk_ids, one.topk_weights)), 1e-2);
  // A few tokens only: ranks without tokens still compute for others.
  CpuEpMoe ep8(w, 8);
  const std::vector<float> x3(x.begin(), x.begin() + 3 * c.hidden);
  EXPECT_EQ(ep8.forward_host({.x = x3, .tokens = 3}).y, single.forward_host({.x = x3, .tokens = 3}).y);
}

TEST(CpuEp, CallerRoutingWithMinusOneAndSkewToOneRank) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(64, 48, 16, 3);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 40, k = c.top_k;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  std::vector<float> wts(static_cast<size_t>(T * k));
  // Every pair goes to rank 3 of 4 (experts 12..15), some slots -1, token 0 all -1.
  for (size_t i = 0; i < ids.size(); ++i) {
    ids[i] = rng.below(5) == 0 ? -1 : int32_t(12 + rng.below(4));
    wts[i] = rng.uniform(0.2f, 1.0f);
  }
  for (int64_t j = 0; j < k; ++j) ids[size_t(j)] = -1;
  Moe single(w, MoeOptions{});
  const std::vector<float> y1 = single.forward_host({.x = x, .tokens = T, .topk_ids = ids, .topk_weights = wts}).y;
  int64_t routed = 0;
  for (int32_t id : ids) routed += id >= 0;
  CpuEpMoe ep(w, 4);
  EXPECT_EQ(ep.forward_host({.x = x, .tokens = T, .topk_ids = ids, .topk_weights = wts}).y, y1);
  const CpuEpStats& st = ep.last_stats();
  EXPECT_EQ(st.received, (std::vector<int64_t>{0, 0, 0, routed})) << "all pairs land on rank 3";
  EXPECT_EQ(st.tokens, (std::vector<int64_t>{10, 10, 10, 10}));
  EXPECT_LE(rel_l2(y1, reference_moe_f64(w, x, T, ids, wts)), 1e-2);
}

TEST(CpuEp, HashRoutedAndStaticScalesMatchOneRank) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(64, 32, 8, 2);
  c.hash_routed = true;
  c.l1_input = c.l2_input = InputScaleMode::Static;
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 21;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  std::vector<int32_t> tok(static_cast<size_t>(T));
  for (auto& t : tok) t = int32_t(rng.below(kSyntheticVocab));
  Moe single(w, MoeOptions{});
  const std::vector<float> y1 = single.forward_host({.x = x, .tokens = T, .token_ids = tok}).y;
  for (int R : {2, 8}) {
    CpuEpMoe ep(w, R);
    EXPECT_EQ(ep.forward_host({.x = x, .tokens = T, .token_ids = tok}).y, y1) << "R=" << R;
  }
}

TEST(CpuEp, CapacityOverflowIsAnErrorNamingRankCountAndCapacity) {
  MoeConfig c = small_config(64, 32, 8, 2);
  const MoeWeights w = make_synthetic_moe(c, 4);
  const int64_t T = 10, k = 2;
  std::vector<float> x(static_cast<size_t>(T * c.hidden), 0.25f);
  std::vector<int32_t> ids(static_cast<size_t>(T * k), 1);  // all pairs to expert 1 = rank 0
  std::vector<float> wts(static_cast<size_t>(T * k), 0.5f);
  CpuEpOptions opt;
  opt.recv_capacity = 19;
  CpuEpMoe ep(w, 2, opt);
  const std::string msg = error_of([&] { ep.forward_host({.x = x, .tokens = T, .topk_ids = ids, .topk_weights = wts}); });
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("receive 20"), std::string::npos) << msg;
  EXPECT_NE(msg.find("capacity 19"), std::string::npos) << msg;
  ids[0] = -1;  // 19 pairs fit exactly
  EXPECT_NO_THROW(ep.forward_host({.x = x, .tokens = T, .topk_ids = ids, .topk_weights = wts}).y);
}

TEST(CpuEp, BadConfigurationsAndIds) {
  MoeConfig c = small_config(64, 32, 12, 2);
  const MoeWeights w = make_synthetic_moe(c, 5);
  const std::string msg = error_of([&] { CpuEpMoe ep(w, 8); });
  EXPECT_NE(msg.find("E=12"), std::string::npos) << msg;
  EXPECT_NE(msg.find("R=8"), std::string::npos) << msg;
  EXPECT_NE(error_of([&] { CpuEpMoe ep(w, 0); }).find("R must be >= 1"), std::string::npos);
  CpuEpMoe ep(w, 4);
  std::vector<float> x(static_cast<size_t>(3 * c.hidden), 0.1f);
  std::vector<int32_t> ids = {0, 1, 2, 3, 12, 5};
  std::vector<float> wts(6, 1.0f);
  const std::string bad = error_of([&] { ep.forward_host({.x = x, .tokens = 3, .topk_ids = ids, .topk_weights = wts}); });
  EXPECT_NE(bad.find("token 2 slot 0 has expert id 12"), std::string::npos) << bad;
}

TEST(CpuEp, ManyTokensMatchTheBackendsPassesBitwise) {
  // The backend works in passes of 1024 tokens, the EP emulation in one go:
  // grouping must not change any bit.
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  MoeConfig c = small_config(64, 32, 8, 3);
  Rng rng(seed);
  const MoeWeights w = make_synthetic_moe(c, rng.next());
  const int64_t T = 2100;
  const std::vector<float> x = random_hidden(rng, T, c.hidden);
  Moe single(w, MoeOptions{});
  const HostResult one = single.forward_host({.x = x, .tokens = T});
  const std::vector<float>& y = one.y;
  const std::vector<int32_t>& ids = one.topk_ids;
  const std::vector<float>& wts = one.topk_weights;
  CpuEpMoe ep1(w, 1), ep2(w, 2);
  EXPECT_EQ(ep1.forward_host({.x = x, .tokens = T}).y, y);
  EXPECT_EQ(ep2.forward_host({.x = x, .tokens = T}).y, y);
  EXPECT_LE(rel_l2(y, reference_moe_f64(w, x, T, ids, wts)), 1e-2);
}

TEST(CpuEpPlan, CountsOffsetsAndChunks) {
  // 5 tokens, k = 2, E = 4, R = 2 (experts 0,1 on rank 0; 2,3 on rank 1).
  const std::vector<int32_t> ids = {0, 3, -1, 2, 1, 1, 3, -1, 2, 0};
  const ep::CpuDispatchPlan p = ep::plan_cpu_dispatch(ids.data(), 5, 2, 4, 2, 0);
  EXPECT_EQ(p.token_begin, (std::vector<int64_t>{0, 3, 5}));
  // rank 0 tokens 0..2 send {0,3,-,2,1,1}: 3 to rank 0, 2 to rank 1; rank 1 tokens 3,4 send {3,-,2,0}: 1, 2.
  EXPECT_EQ(p.send_count, (std::vector<int64_t>{3, 2, 1, 2}));
  EXPECT_EQ(p.recv_count, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(p.recv_offset, (std::vector<int64_t>{0, 0, 3, 2}));
}

}  // namespace
}  // namespace nvfp4moe::test
