// The expert-parallel bookkeeping shared by the NCCL path, the one-GPU
// emulation and the CPU emulation (src/ep/ep_index.hpp): host-only checks,
// worked out by hand from docs/numerics.md §6.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "ep/ep_index.hpp"

namespace nvfp4moe::ep {
namespace {

TEST(EpIndex, OwnersAndLocalIdsOfDeepSeekV4ProOver8Ranks) {
  const int32_t E = 384, R = 8, epr = experts_per_rank(E, R);
  EXPECT_EQ(epr, 48);
  const std::vector<std::pair<int32_t, int32_t>> cases = {{0, 0}, {47, 0}, {48, 1}, {200, 4}, {383, 7}};
  for (const auto& [id, rank] : cases) {
    SCOPED_TRACE("id=" + std::to_string(id));
    EXPECT_EQ(slot_owner(id, E, epr), rank);
    EXPECT_EQ(local_expert(id, rank, epr), id - rank * 48);
  }
  // -1 and anything outside [-1, E) go nowhere; only the latter is an error.
  for (int32_t id : {-1, -2, -1000, 384, 385, 1 << 30}) {
    EXPECT_EQ(slot_owner(id, E, epr), -1) << id;
    EXPECT_FALSE(expert_id_routed(id, E)) << id;
    EXPECT_EQ(expert_id_in_range(id, E), id == -1) << id;
  }
}

TEST(EpIndex, TokenChunksAreContiguousAndBalanced) {
  for (int64_t T : {0, 1, 7, 8, 37, 4096}) {
    for (int32_t R : {1, 2, 3, 8}) {
      SCOPED_TRACE("T=" + std::to_string(T) + " R=" + std::to_string(R));
      EXPECT_EQ(token_chunk_begin(T, R, 0), 0);
      EXPECT_EQ(token_chunk_begin(T, R, R), T);
      for (int32_t r = 0; r < R; ++r) {
        const int64_t n = token_chunk_begin(T, R, r + 1) - token_chunk_begin(T, R, r);
        EXPECT_TRUE(n == T / R || n == T / R + 1) << "rank " << r << " holds " << n;
      }
    }
  }
  // 37 over 8: the first 37 % 8 = 5 ranks hold one more.
  EXPECT_EQ(token_chunk_begin(37, 8, 5), 25);
  EXPECT_EQ(token_chunk_begin(37, 8, 6), 29);
}

TEST(EpIndex, CombineRowsAndCapacity) {
  EXPECT_EQ(combine_row(0, 0, 6), 0);
  EXPECT_EQ(combine_row(3, 5, 6), 23);
  // Expert placed at first row 10 of a receive area of 12 rows: 2 fit.
  EXPECT_EQ(recv_row_or_drop(10, 0, 12), 10);
  EXPECT_EQ(recv_row_or_drop(10, 1, 12), 11);
  EXPECT_EQ(recv_row_or_drop(10, 2, 12), -1);
  EXPECT_EQ(recv_row_or_drop(20, 0, 12), -1);
}

TEST(EpIndex, SegmentLayoutAreasAreAlignedDisjointAndLargeEnough) {
  const int32_t H = 7168, k = 6, E = 384, R = 8, T = 512, C = 2 * T * k;
  const SegmentLayout L = make_segment_layout(H, k, E, R, T, C);
  EXPECT_EQ(L.local_experts, 48);
  const uint64_t t = uint64_t(T), kk = uint64_t(k), h = uint64_t(H), c = uint64_t(C), l = 48;
  // (offset, bytes needed) in layout order
  const std::vector<std::pair<uint64_t, uint64_t>> areas = {
      {L.send_count, 4}, {L.send_codes, t * h / 2},     {L.send_scales, t * h / 16},
      {L.send_g, t * 4},           {L.send_ids, t * kk * 4},      {L.send_weights, t * kk * 4},
      {L.combine_rows, t * kk * h * 4}, {L.combine_flags, t * kk * 4}, {L.recv_codes, c * h / 2},
      {L.recv_scales, c * h / 16}, {L.recv_g, c * 4},             {L.recv_expert, c * 4},
      {L.recv_weight, c * 4},      {L.expert_count, l * 4},       {L.expert_first, l * 4},
      {L.expert_offset, (l + 1) * 4}, {L.expert_cursor, l * 4},   {L.recv_total, 4},
      {L.dispatch_done, 4},        {L.error_word, 4}};
  for (size_t i = 0; i < areas.size(); ++i) {
    SCOPED_TRACE("area " + std::to_string(i));
    EXPECT_EQ(areas[i].first % 256, 0u);
    const uint64_t end = areas[i].first + areas[i].second;
    EXPECT_LE(end, i + 1 < areas.size() ? areas[i + 1].first : L.bytes);
  }
  EXPECT_EQ(L.bytes % 256, 0u);
  // BF16 combine: the same areas, the combine rows half as large.
  const SegmentLayout B = make_segment_layout(H, k, E, R, T, C, /*combine_bf16=*/true);
  EXPECT_EQ(B.combine_bytes, 2);
  EXPECT_EQ(B.combine_flags - B.combine_rows, t * kk * h * 2);
  EXPECT_EQ(L.bytes - B.bytes, t * kk * h * 2);
  // Combine row r at r rows of H values past the area's start; the last row
  // ends where the flags begin.
  EXPECT_EQ(combine_row_offset(L, 0), L.combine_rows);
  EXPECT_EQ(combine_row_offset(L, combine_row(3, 5, k)), L.combine_rows + 23 * h * 4);
  EXPECT_EQ(combine_row_offset(B, 23), B.combine_rows + 23 * h * 2);
  EXPECT_LE(combine_row_offset(L, int64_t(t * kk) - 1) + h * 4, L.combine_flags);
  EXPECT_LE(combine_row_offset(B, int64_t(t * kk) - 1) + h * 2, B.combine_flags);
}

// A forward's view of a layout (the token bound): the same areas and size,
// max_tokens = the bound, and the receive capacity R * bound * k when that is
// below the layout's, else the layout's.
TEST(EpIndex, ForwardLayoutKeepsTheAreasAndBoundsTheCounts) {
  const int32_t H = 7168, k = 6, E = 384, R = 8, T = 512, C = 4096;
  const SegmentLayout L = make_segment_layout(H, k, E, R, T, C);
  const SegmentLayout one = forward_layout(L, 1);
  EXPECT_EQ(one.max_tokens, 1);
  EXPECT_EQ(one.recv_capacity, 48);  // 8 ranks x 1 token x 6 slots
  const SegmentLayout big = forward_layout(L, 100);
  EXPECT_EQ(big.max_tokens, 100);
  EXPECT_EQ(big.recv_capacity, C);  // 4800 pairs could arrive: the layout's 4096 holds
  const SegmentLayout whole = forward_layout(L, T);
  EXPECT_EQ(whole.max_tokens, T);
  EXPECT_EQ(whole.recv_capacity, C);
  for (const SegmentLayout* f : {&one, &big, &whole}) {
    EXPECT_EQ(f->bytes, L.bytes);
    EXPECT_EQ(f->send_codes, L.send_codes);
    EXPECT_EQ(f->combine_rows, L.combine_rows);
    EXPECT_EQ(f->recv_codes, L.recv_codes);
    EXPECT_EQ(f->recv_weight, L.recv_weight);
    EXPECT_EQ(f->expert_offset, L.expert_offset);
    EXPECT_EQ(f->error_word, L.error_word);
    EXPECT_EQ(f->local_experts, L.local_experts);
    EXPECT_EQ(f->top_k, L.top_k);
  }
}

// The bytes a forward moves between GPUs for one home rank's tokens, by
// hand: R = 2, E = 4 (rank 0 owns experts 0-1, rank 1 experts 2-3), k = 2,
// H = 32 (a token row: 16 code bytes + 2 scale bytes).
TEST(EpIndex, TrafficOfAHomeRanksTokensByHand) {
  const std::vector<int32_t> ids = {0, 1,    // both slots on rank 0
                                    1, 2,    // one on each rank
                                    3, 2,    // both on rank 1: the row is read once
                                    -1, 3};  // -1 goes nowhere
  const SegmentLayout f32 = make_segment_layout(32, 2, 4, 2, 4, 16);
  const SegmentLayout bf16 = make_segment_layout(32, 2, 4, 2, 4, 16, true);
  // Home rank 0: rank 1 reads every token's 2 ids twice (count, booking): 2 x 4 x 2 x 4 = 64 bytes;
  // the rows of tokens 1, 2, 3 (3 x 18) and 8 bytes a remote pair (4 pairs).
  EpTraffic t = ep_home_traffic(f32, 0, ids.data(), 4);
  EXPECT_EQ(t.remote_pairs, 4);
  EXPECT_EQ(t.dispatch_bytes, 64u + 3 * 18 + 4 * 8);
  EXPECT_EQ(t.combine_bytes, 4u * (32 * 4 + 4));
  EXPECT_EQ(ep_home_traffic(bf16, 0, ids.data(), 4).combine_bytes, 4u * (32 * 2 + 4));
  // The same ids as rank 1's tokens: the remote slots are those on rank 0 (tokens 0 and 1).
  t = ep_home_traffic(f32, 1, ids.data(), 4);
  EXPECT_EQ(t.remote_pairs, 3);
  EXPECT_EQ(t.dispatch_bytes, 64u + 2 * 18 + 3 * 8);
  EXPECT_EQ(t.combine_bytes, 3u * (32 * 4 + 4));
  // One rank: nothing leaves the GPU.
  t = ep_home_traffic(make_segment_layout(32, 2, 4, 1, 4, 16), 0, ids.data(), 4);
  EXPECT_EQ(t.remote_pairs, 0);
  EXPECT_EQ(t.dispatch_bytes, 0u);
  EXPECT_EQ(t.combine_bytes, 0u);
}

// DeepSeek-V4-Pro over 8 ranks, random routing: against a count of the
// (token, peer) rows and remote pairs made with sets.
TEST(EpIndex, TrafficMatchesACountOfRowsAndPairs) {
  const int32_t H = 7168, k = 6, E = 384, R = 8, T = 300;
  const SegmentLayout L = make_segment_layout(H, k, E, R, T, 4096);
  std::mt19937 rng(20261204);
  std::uniform_int_distribution<int32_t> expert(-1, E - 1);
  std::vector<int32_t> ids(size_t(T) * k);
  for (int32_t& id : ids) id = expert(rng);
  for (const int32_t home : {0, 5}) {
    int64_t pairs = 0, rows = 0;
    for (int64_t t = 0; t < T; ++t) {
      std::set<int32_t> peers;
      for (int j = 0; j < k; ++j) {
        const int32_t id = ids[size_t(t * k + j)];
        if (id < 0 || id / (E / R) == home) continue;
        ++pairs;
        peers.insert(id / (E / R));
      }
      rows += int64_t(peers.size());
    }
    const EpTraffic got = ep_home_traffic(L, home, ids.data(), T);
    EXPECT_EQ(got.remote_pairs, pairs) << "home " << home;
    EXPECT_EQ(got.dispatch_bytes, uint64_t(2 * (R - 1) * T * k * 4 + rows * (H / 2 + H / 16) + pairs * 8))
        << "home " << home;
    EXPECT_EQ(got.combine_bytes, uint64_t(pairs) * (uint64_t(H) * 4 + 4)) << "home " << home;
    EXPECT_GT(rows, 0);
    EXPECT_LT(rows, pairs);  // some tokens have two slots on one peer: their row travels once
  }
}

}  // namespace
}  // namespace nvfp4moe::ep
