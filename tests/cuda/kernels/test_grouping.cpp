// group_pairs against a host reference (ids written back, offsets, every
// group's pairs, the error bit) and against group_pairs_ref: identical offsets,
// work list, ids and error bit; the same pairs in every group (order inside a
// group is atomic order in both) and a consistent permutation.
#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/error_word.hpp"
#include "cuda/kernels/grouping.hpp"
#include "cuda/kernels/ref/grouping_ref.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

struct Grouped {
  std::vector<int32_t> ids, offsets, pair_of_pos, pos_of_pair, expert_of_pos;
  std::vector<GemmTile> tiles;
  int32_t num_tiles = 0;
  std::vector<uint32_t> err;
};

Grouped run_group(bool fast, const std::vector<int64_t>& ids64, bool i64, int64_t T, int k, int64_t E, int64_t first,
                  int64_t local) {
  const int64_t P = T * k;
  std::vector<int32_t> ids32(ids64.begin(), ids64.end());
  DeviceBuffer<uint8_t> dids(size_t(P) * 8);
  if (i64) {
    NVFP4_CUDA_CHECK(cudaMemcpy(dids.get(), ids64.data(), size_t(P) * 8, cudaMemcpyHostToDevice));
  } else {
    NVFP4_CUDA_CHECK(cudaMemcpy(dids.get(), ids32.data(), size_t(P) * 4, cudaMemcpyHostToDevice));
  }
  DeviceBuffer<int32_t> ids_out(static_cast<size_t>(P)), offsets(static_cast<size_t>(local + 1)),
      pop(static_cast<size_t>(P)), pop2(static_cast<size_t>(P)), eop(static_cast<size_t>(P)), nt(1);
  const int64_t max_tiles = max_gemm_tiles(P, local, 64);
  DeviceBuffer<GemmTile> tiles(static_cast<size_t>(max_tiles));
  DeviceBuffer<uint32_t> err(kErrorWords);
  NVFP4_CUDA_CHECK(cudaMemset(err.get(), 0, err.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(pop.get(), 0xFF, pop.bytes()));
  GroupingArgs a;
  a.topk_ids = dids.get();
  a.ids_i64 = i64;
  a.tokens = T;
  a.top_k = k;
  a.experts = E;
  a.first_expert = first;
  a.local_experts = local;
  a.tile_rows = 64;
  a.ids_out = ids_out.get();
  a.offsets = offsets.get();
  a.pair_of_pos = pop.get();
  a.pos_of_pair = pop2.get();
  a.expert_of_pos = eop.get();
  a.tiles = tiles.get();
  a.num_tiles = nt.get();
  a.error_word = err.get();
  fast ? group_pairs(a, nullptr) : group_pairs_ref(a, nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  Grouped g;
  g.ids.resize(size_t(P));
  g.offsets.resize(size_t(local + 1));
  g.pair_of_pos.resize(size_t(P));
  g.pos_of_pair.resize(size_t(P));
  g.expert_of_pos.resize(size_t(P));
  g.err.resize(kErrorWords);
  ids_out.download(g.ids.data(), g.ids.size());
  offsets.download(g.offsets.data(), g.offsets.size());
  pop.download(g.pair_of_pos.data(), g.pair_of_pos.size());
  pop2.download(g.pos_of_pair.data(), g.pos_of_pair.size());
  eop.download(g.expert_of_pos.data(), g.expert_of_pos.size());
  nt.download(&g.num_tiles, 1);
  err.download(g.err.data(), g.err.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  g.tiles.resize(size_t(std::max(0, g.num_tiles)));
  if (g.num_tiles > 0) tiles.download(g.tiles.data(), g.tiles.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  return g;
}

class Sm90Group : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, int64_t, bool>> {};

TEST_P(Sm90Group, MatchesGroupPairs) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const auto [T, first, local, i64] = GetParam();
  const int k = 6;
  const int64_t E = 384;
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " T=" << T << " local [" << first << ", " << first + local
                                    << ") i64=" << i64);
  test::Rng rng(seed);
  std::vector<int64_t> ids(size_t(T * k));
  for (auto& id : ids) {
    const int64_t r = rng.below(100);
    id = r == 0 ? -1 : (r == 1 && T > 4 ? (rng.below(2) ? E + 3 : -7) : rng.below(E));
  }
  const Grouped a = run_group(true, ids, i64, T, k, E, first, local);
  const Grouped b = run_group(false, ids, i64, T, k, E, first, local);
  // Host reference: ids as written back, every local expert's pairs in slot order, the error bit.
  std::vector<int32_t> want_ids(ids.size());
  std::vector<std::vector<int32_t>> want_pairs(static_cast<size_t>(local));
  bool out_of_range = false;
  for (size_t p = 0; p < ids.size(); ++p) {
    const bool in_range = ids[p] >= -1 && ids[p] < E;
    out_of_range |= !in_range;
    want_ids[p] = in_range ? int32_t(ids[p]) : -1;
    if (in_range && ids[p] >= first && ids[p] < first + local) want_pairs[size_t(ids[p] - first)].push_back(int32_t(p));
  }
  EXPECT_EQ(a.ids, want_ids);
  EXPECT_EQ((a.err[0] & kErrExpertIdOutOfRange) != 0, out_of_range) << "error bits " << a.err[0];
  for (int64_t e = 0, start = 0; e < local; start += int64_t(want_pairs[size_t(e)].size()), ++e) {
    ASSERT_EQ(a.offsets[size_t(e)], start) << "offset of local expert " << e;
    std::vector<int32_t> got(a.pair_of_pos.begin() + start, a.pair_of_pos.begin() + start + int64_t(want_pairs[size_t(e)].size()));
    std::sort(got.begin(), got.end());
    ASSERT_EQ(got, want_pairs[size_t(e)]) << "pairs of local expert " << e;
  }
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.offsets, b.offsets);
  ASSERT_EQ(a.num_tiles, b.num_tiles);
  for (int32_t i = 0; i < a.num_tiles; ++i) {
    ASSERT_EQ(a.tiles[size_t(i)].expert, b.tiles[size_t(i)].expert) << "tile " << i;
    ASSERT_EQ(a.tiles[size_t(i)].begin, b.tiles[size_t(i)].begin) << "tile " << i;
    ASSERT_EQ(a.tiles[size_t(i)].rows, b.tiles[size_t(i)].rows) << "tile " << i;
  }
  EXPECT_EQ(a.err[0], b.err[0]) << "error bits";
  const int32_t live = a.offsets.back();
  for (int64_t e = 0; e < local; ++e) {
    std::vector<int32_t> pa(a.pair_of_pos.begin() + a.offsets[size_t(e)], a.pair_of_pos.begin() + a.offsets[size_t(e + 1)]);
    std::vector<int32_t> pb(b.pair_of_pos.begin() + b.offsets[size_t(e)], b.pair_of_pos.begin() + b.offsets[size_t(e + 1)]);
    std::sort(pa.begin(), pa.end());
    std::sort(pb.begin(), pb.end());
    ASSERT_EQ(pa, pb) << "pairs of local expert " << e;
  }
  for (int32_t pos = 0; pos < live; ++pos) {
    const int32_t pair = a.pair_of_pos[size_t(pos)];
    ASSERT_EQ(a.pos_of_pair[size_t(pair)], pos) << "permutation at position " << pos;
    ASSERT_EQ(a.expert_of_pos[size_t(pos)], ids[size_t(pair)] - first) << "expert of position " << pos;
  }
  for (size_t p = 0; p < ids.size(); ++p) {
    if (ids[p] < first || ids[p] >= first + local) {
      ASSERT_EQ(a.pos_of_pair[p], -1) << "pair " << p << " not local";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Routing, Sm90Group,
                         ::testing::Values(std::make_tuple(int64_t(1), int64_t(0), int64_t(384), false),
                                           std::make_tuple(int64_t(64), int64_t(48), int64_t(48), false),
                                           std::make_tuple(int64_t(700), int64_t(0), int64_t(384), true),
                                           std::make_tuple(int64_t(3000), int64_t(96), int64_t(48), false),
                                           // more slots than one batch of loads of the block (8 x 1024), and a
                                           // prefill-sized batch whose slots fill the batches exactly
                                           std::make_tuple(int64_t(1500), int64_t(0), int64_t(384), true),
                                           std::make_tuple(int64_t(8192), int64_t(48), int64_t(48), false)));

}  // namespace
}  // namespace nvfp4moe::cuda
