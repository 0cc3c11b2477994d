// Rows of NVFP4 / MXFP4 weights as E4M3 values times a power of two
// (e4m3_row_shifts, nvfp4moe/format.hpp): hand-built rows at the edge of
// the 17 binades one shift holds and one past it, the power-of-two rule of
// NVFP4's block factors, and the structural check against its reference on
// fresh random rows.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

using namespace nvfp4moe;

namespace {

// One MXFP4 row of 64 elements: element 0 of block 0 is `hi_code` under
// scale 2^a, element 0 of block 1 is `lo_code` under 2^b; the rest zero.
struct MxRow {
  std::vector<uint8_t> codes = std::vector<uint8_t>(32, 0), scales = std::vector<uint8_t>(2, 127);
};
MxRow mx_row(uint8_t hi_code, int a, uint8_t lo_code, int b) {
  MxRow r;
  r.codes[0] = hi_code;
  r.codes[16] = lo_code;
  r.scales[0] = uint8_t(127 + a);
  r.scales[1] = uint8_t(127 + b);
  return r;
}

E4m3RowShifts check_mx(const MxRow& r) {
  return e4m3_row_shifts(r.codes.data(), r.scales.data(), 32, nullptr, 0, 1, 64);
}

}  // namespace

TEST(E4m3RowShifts, SeventeenBinadesFitOneShift) {
  // 6 * 2^5 (code 7: 1.5 * 2^2) down to 1 * 2^-12 (code 2): top 7, bottom -12, 19 binades: too wide.
  EXPECT_FALSE(check_mx(mx_row(7, 5, 2, -12)).exact);
  // Top 7 and bottom -10: 17 binades. r = -1: 6 * 2^5 / 2^-1 = 384, 2^-10 / 2^-1 = 2^-9.
  const E4m3RowShifts ok = check_mx(mx_row(7, 5, 2, -10));
  ASSERT_TRUE(ok.exact) << ok.why;
  ASSERT_EQ(ok.shift.size(), 1u);
  EXPECT_EQ(ok.shift[0], -1);
  EXPECT_EQ(e4m3_decode(e4m3_encode(0x1p-9f)), 0x1p-9f);  // the smallest, exact
  // One binade more at the bottom (1 * 2^-11): 2^-10 after the shift is not an E4M3 value.
  const E4m3RowShifts wide = check_mx(mx_row(7, 5, 2, -11));
  EXPECT_FALSE(wide.exact);
  EXPECT_EQ(wide.row, 0);
  EXPECT_NE(wide.why.find("18 binades"), std::string::npos) << wide.why;
  // 1.5 at the bottom needs one binade more room: 1.5 * 2^-9 (code 3 under 2^-9) after r = -1 is
  // 1.5 * 2^-8 = 3 * 2^-9, exact; under 2^-10 it would be 1.5 * 2^-9, not.
  EXPECT_TRUE(check_mx(mx_row(7, 5, 3, -9)).exact);
  EXPECT_FALSE(check_mx(mx_row(7, 5, 3, -10)).exact);
  // Signs do not matter (0xF is -6, 0xA is -1).
  EXPECT_TRUE(check_mx(mx_row(0xF, 5, 0xA, -10)).exact);
  // An all-zero row: exact, shift 0, whatever its scales.
  MxRow zero = mx_row(0, 100, 0x8, -100);
  const E4m3RowShifts z = check_mx(zero);
  EXPECT_TRUE(z.exact);
  EXPECT_EQ(z.shift[0], 0);
}

TEST(E4m3RowShifts, Nvfp4FactorsMustBePowersOfTwo) {
  // Two rows of 32 elements (two blocks each), g = 2^-3, scales 1.0 (0x38) and 2.0 (0x40).
  std::vector<uint8_t> codes(32, 0x22);  // every element code 2 (1.0)
  std::vector<uint8_t> scales = {0x38, 0x40, 0x38, 0x40};
  std::vector<float> g = {0.125f, 0.125f};
  E4m3RowShifts r = e4m3_row_shifts(codes.data(), scales.data(), 16, g.data(), 1, 2, 32);
  ASSERT_TRUE(r.exact) << r.why;
  EXPECT_EQ(r.shift[0], -2 - 8);  // largest 1.0 * 2.0 * 2^-3 = 2^-2
  // 0x3F is E4M3 1.875: a block factor 1.875 * 2^-3, not a power of two.
  scales[3] = 0x3F;
  r = e4m3_row_shifts(codes.data(), scales.data(), 16, g.data(), 1, 2, 32);
  EXPECT_FALSE(r.exact);
  EXPECT_EQ(r.row, 1);
  EXPECT_NE(r.why.find("0x3F"), std::string::npos) << r.why;
  EXPECT_NE(r.why.find("columns 16..31"), std::string::npos) << r.why;
  // The same block with zero codes: no weight takes that factor.
  for (int i = 24; i < 32; ++i) codes[size_t(i)] = 0x88;  // -0 and -0
  EXPECT_TRUE(e4m3_row_shifts(codes.data(), scales.data(), 16, g.data(), 1, 2, 32).exact);
  // A global scale that is not a power of two.
  scales[3] = 0x40;
  g[0] = 0.1f;
  r = e4m3_row_shifts(codes.data(), scales.data(), 16, g.data(), 1, 2, 32);
  EXPECT_FALSE(r.exact);
  EXPECT_EQ(r.row, 0);
  EXPECT_ERROR_CONTAINS(e4m3_row_shifts(codes.data(), scales.data(), 24, g.data(), 1, 2, 32), "16 (NVFP4) or 32");
  EXPECT_ERROR_CONTAINS(e4m3_row_shifts(codes.data(), scales.data(), 16, g.data(), 1, 2, 40), "multiple of 16");
  EXPECT_ERROR_CONTAINS(e4m3_row_shifts(codes.data(), scales.data(), 16, nullptr, 0, 2, 32), "need their global scales");
  EXPECT_ERROR_CONTAINS(e4m3_row_shifts(nullptr, scales.data(), 32, nullptr, 0, 1, 32), "codes or scales are null");
  EXPECT_ERROR_CONTAINS(e4m3_row_shifts_ref(codes.data(), scales.data(), 16, nullptr, 0, 2, 32), "need their global scales");
}

// Random rows whose scale exponents spread around the limit: the structural
// check and the reference agree on exactness, the failing row and every shift.
TEST(E4m3RowShifts, MatchesTheReferenceOnRandomRows) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  int exact = 0, inexact = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool mx = trial % 2 == 0;
    const int block = mx ? 32 : 16;
    const int64_t rows = 1 + rng.below(4), cols = block * (1 + rng.below(8));
    const int spread = int(rng.below(22));
    const int base = int(rng.below(40)) - 20;
    std::vector<uint8_t> codes(size_t(rows * cols / 2)), scales(size_t(rows * cols / block));
    for (auto& c : codes) c = uint8_t(rng.next());
    for (int64_t i = 0; i < int64_t(codes.size()); ++i)
      if (rng.below(3) == 0) codes[size_t(i)] = 0;  // zero codes and zero blocks too
    std::vector<float> g(static_cast<size_t>(rows));
    for (auto& s : scales) {
      const int e = base + int(rng.below(spread + 1));
      if (mx) {
        s = uint8_t(127 + e);
      } else {
        const int ee = std::max(-6, std::min(7, e / 3));  // E4M3 normal powers of two (no 0x7F NaN below)
        s = uint8_t((ee + 7) << 3);
        if (rng.below(40) == 0) s = uint8_t(s | (1 + rng.below(7)));  // now and then not a power of two
      }
    }
    for (auto& v : g) v = rng.below(10) == 0 ? 0.3f : std::ldexp(1.0f, int(rng.below(30)) - 15);
    const E4m3RowShifts got = e4m3_row_shifts(codes.data(), scales.data(), block, g.data(), 1, rows, cols);
    const E4m3RowShifts want = e4m3_row_shifts_ref(codes.data(), scales.data(), block, g.data(), 1, rows, cols);
    ASSERT_EQ(got.exact, want.exact) << "trial " << trial << ": " << got.why << " | " << want.why;
    ASSERT_EQ(got.row, want.row) << "trial " << trial;
    ASSERT_EQ(got.shift, want.shift) << "trial " << trial;
    (got.exact ? exact : inexact) += 1;
  }
  // Both outcomes are exercised.
  EXPECT_GT(exact, 40);
  EXPECT_GT(inexact, 40);
}
