// The grouped GEMM's weight tile layout (host code, runs without a GPU):
// hand-checked positions and a pack/unpack round trip on odd geometries.
#include <gtest/gtest.h>

#include "cuda/layout/tile_layout.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using cuda::Projection;

TEST(CudaWeightLayout, RoundTripOddGeometries) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  test::Rng rng(seed);
  for (auto [H, I] : {std::pair<int64_t, int64_t>{48, 80}, {128, 64}, {16, 16}, {208, 144}})
    for (Projection p : {Projection::GateUp, Projection::Down}) {
      const int64_t N = p == Projection::GateUp ? 2 * I : H, K = p == Projection::GateUp ? H : I;
      std::vector<uint8_t> codes(size_t(N * K / 2)), scales(size_t(N * K / 16));
      for (auto& b : codes) b = uint8_t(rng.next());
      for (auto& b : scales) b = uint8_t(rng.next());
      const auto g = cuda::packed_geometry(p, H, I);
      std::vector<uint8_t> packed(size_t(g.bytes_per_expert()), 0xEE);
      cuda::pack_expert_weights(p, codes.data(), scales.data(), H, I, packed.data());
      std::vector<uint8_t> c2(codes.size(), 0), s2(scales.size(), 0);
      cuda::unpack_expert_weights(p, packed.data(), H, I, c2.data(), s2.data());
      EXPECT_BYTES_EQ(c2.data(), codes.data(), int64_t(codes.size()), "codes H=" << H << " I=" << I);
      EXPECT_BYTES_EQ(s2.data(), scales.data(), int64_t(scales.size()), "scales H=" << H << " I=" << I);
      // Packing over a different prefill must give the same bytes: none left unwritten.
      std::vector<uint8_t> again(packed.size(), 0x11);
      cuda::pack_expert_weights(p, codes.data(), scales.data(), H, I, again.data());
      EXPECT_BYTES_EQ(again.data(), packed.data(), int64_t(packed.size()), "packed bytes depend on the prefill");
    }
}

TEST(CudaWeightLayout, HandCheckedPositions) {
  // GateUp, H = 64, I = 64: one n-tile, one k-step. Tile row 8 is UP row 0
  // (source row I + 0 = 64); tile row 16 is gate row 8. Code byte p of a block
  // holds source byte {0,4,1,5,2,6,3,7}[p].
  const int64_t H = 64, I = 64;
  std::vector<uint8_t> codes(size_t(2 * I * H / 2)), scales(size_t(2 * I * H / 16));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = uint8_t(i * 7 + 1);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i * 3 + 2);
  std::vector<uint8_t> packed(size_t(cuda::packed_geometry(Projection::GateUp, H, I).bytes_per_expert()));
  cuda::pack_expert_weights(Projection::GateUp, codes.data(), scales.data(), H, I, packed.data());
  const int64_t rc = H / 2;  // code bytes per source row
  EXPECT_EQ(packed[8 * 32 + 0], codes[size_t(64 * rc + 0)]);
  EXPECT_EQ(packed[8 * 32 + 1], codes[size_t(64 * rc + 4)]);
  EXPECT_EQ(packed[16 * 32 + 2], codes[size_t(8 * rc + 1)]);
  EXPECT_EQ(packed[0 * 32 + 9], codes[size_t(0 * rc + 8 + 4)]);
  EXPECT_EQ(packed[cuda::kTileCodeBytes + 8 * 4 + 3], scales[size_t(64 * (H / 16) + 3)]);
  // Padding: I = 64 fills the tile exactly; with I = 48 rows for i >= 48 are zero.
  const int64_t I2 = 48;
  std::vector<uint8_t> c2(size_t(2 * I2 * H / 2), 0x11), s2(size_t(2 * I2 * H / 16), 0x22);
  std::vector<uint8_t> p2(size_t(cuda::packed_geometry(Projection::GateUp, H, I2).bytes_per_expert()));
  cuda::pack_expert_weights(Projection::GateUp, c2.data(), s2.data(), H, I2, p2.data());
  EXPECT_EQ(p2[size_t(95 * 32)], 0x11);  // group 5: i = 40..47, live
  EXPECT_EQ(p2[size_t(96 * 32)], 0x00);  // group 6: i = 48.., padding
  EXPECT_EQ(p2[size_t(cuda::kTileCodeBytes + 96 * 4)], 0x00);
}

}  // namespace
}  // namespace nvfp4moe
