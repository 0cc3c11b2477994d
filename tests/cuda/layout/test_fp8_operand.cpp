// The FP8 form of the prefill GEMM, host side (runs without a GPU): the
// operand's column order against the fragment words it pairs with, the
// BF16 -> E4M3 bit conversion of the A fragments on every E4M3 value, the
// operand scale's golden values and exactness on DeepSeek's act_quant output,
// and the weight rows' exponents (exact rows, refused rows named).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "cuda/layout/fp8_operand.hpp"
#include "cuda/layout/scale_multiplier.hpp"
#include "format/mxfp4_codec.hpp"
#include "format/nvfp4_codec.hpp"
#include "support/fp8_act_rows.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

// Logical column of half h of register i in BF16 k-step s of lane t
// (fragment_layout.hpp: columns 16 t + 4 s + {0,1} for registers 0/1 and + {2,3} for 2/3).
int bf16_fragment_column(int t, int s, int i, int h) { return 16 * t + 4 * s + 2 * (i >> 1) + h; }

TEST(Fp8Operand, ColumnOrderMatchesTheFragmentWordsOfEachFp8Register) {
  // FP8 register j of k32 step u, byte b, of lane t is made from BF16 step
  // 2u + (j >> 1), register (j & 1) + 2 (b >> 1), half b & 1; it multiplies
  // the operand byte at k-slot 16 (j >> 1) + 4 t + b of step u.
  std::set<int> seen;
  for (int t = 0; t < 4; ++t)
    for (int u = 0; u < 2; ++u)
      for (int j = 0; j < 4; ++j)
        for (int b = 0; b < 4; ++b) {
          const int col = bf16_fragment_column(t, 2 * u + (j >> 1), (j & 1) + 2 * (b >> 1), b & 1);
          EXPECT_EQ(fp8_operand_column(col), 32 * u + 16 * (j >> 1) + 4 * t + b) << "t " << t << " u " << u << " j " << j;
          seen.insert(fp8_operand_column(col + 64 * 3) - 64 * 3);  // chunks repeat the map
        }
  EXPECT_EQ(seen.size(), 64u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 63);
  // Hand-checked: column 21 is lane t = 1, step u = 0, upper k-slots (h = 1), byte 1.
  EXPECT_EQ(fp8_operand_column(21), 16 + 4 + 1);
  EXPECT_EQ(fp8_operand_column(64 + 8), 64 + 32);
}

// BF16 bits of v (exact: callers pass values BF16 holds).
uint32_t bf16_bits(float v) { return fmt::float_to_bits(v) >> 16; }

TEST(Fp8Operand, PackTurnsEveryE4m3ValueTimesTwoToTheMinus120IntoItsByte) {
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7F) != 0x7F) codes.push_back(uint8_t(c));  // every E4M3 value but NaN, both zeros
  for (size_t i = 0; i < codes.size(); ++i) {
    const uint8_t q[4] = {codes[i], codes[(i + 37) % codes.size()], codes[(i + 101) % codes.size()],
                          codes[(i + 200) % codes.size()]};
    uint32_t x = 0, y = 0;
    for (int h = 0; h < 2; ++h) {
      x |= bf16_bits(fmt::e4m3_value(q[h]) * 0x1p-120f) << (16 * h);
      y |= bf16_bits(fmt::e4m3_value(q[2 + h]) * 0x1p-120f) << (16 * h);
    }
    const uint32_t want = uint32_t(q[0]) | uint32_t(q[1]) << 8 | uint32_t(q[2]) << 16 | uint32_t(q[3]) << 24;
    ASSERT_EQ(fp8_pack_ref(x, y), want) << "codes " << int(q[0]) << " " << int(q[1]) << " " << int(q[2]) << " "
                                        << int(q[3]);
  }
}

TEST(Fp8Operand, RowBiasTimesTheMultiplierGivesTheE4m3ScaledProduct) {
  // NVFP4 scale byte s with multiplier byte d, row exponent E: M'(d) =
  // M(d) * 2^(-100 - E) = e4m3(s) * 2^106 * 2^(-100 - E), so the fragment code
  // pattern value(q) * 2^-126 times M'(d) is (value(q) * e4m3(s) / 2^E) * 2^-120.
  for (int e_row : {-30, -8, 0, 5, 21}) {
    const uint32_t bias = fp8_row_bias_bf16x2(e_row) & 0xffffu;
    for (uint8_t s : {uint8_t(0x08), uint8_t(0x38), uint8_t(0x40), uint8_t(0x01), uint8_t(0x7E)}) {
      const uint8_t d = nvfp4_multiplier_byte(s);
      const float m = fmt::bits_to_float((uint32_t(d) * 0x10u + bias) << 16);
      EXPECT_EQ(m, fmt::e4m3_value(s) * 0x1p106f * std::ldexp(1.0f, -100 - e_row)) << "s " << int(s) << " E " << e_row;
    }
  }
}

TEST(Fp8Operand, ScaleGoldenValues) {
  EXPECT_EQ(fp8_operand_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_operand_scale(448.5f), 2.0f);
  EXPECT_EQ(fp8_operand_scale(480.0f), 2.0f);  // 1.875 * 2^8: above 448, so 2^1
  EXPECT_EQ(fp8_operand_scale(256.0f), 1.0f);
  EXPECT_EQ(fp8_operand_scale(224.0f), 0.5f);
  EXPECT_EQ(fp8_operand_scale(1.0f), 0x1p-8f);
  EXPECT_EQ(fp8_operand_scale(1.875f), 0x1p-7f);
  EXPECT_EQ(fp8_operand_scale(0x1p-126f), 0x1p-134f);
  EXPECT_EQ(fp8_operand_scale(0x1p-130f), 0x1p-134f);  // FP32 subnormal
  EXPECT_EQ(fp8_operand_scale(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(fp8_operand_scale(std::nanf(""))));
  EXPECT_TRUE(std::isnan(fp8_operand_scale(INFINITY)));
}

TEST(Fp8Operand, RowsRefAreExactOnActQuantValues) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const int64_t rows = 9, cols = 384, ld_in = 448, ld_out = 400;
  const std::vector<uint16_t> in = test::act_quant_rows(rng, rows, cols, cols);
  std::vector<uint16_t> strided(size_t(rows * ld_in), 0xFFFF);
  for (int64_t r = 0; r < rows; ++r) std::copy_n(&in[size_t(r * cols)], cols, &strided[size_t(r * ld_in)]);
  std::vector<uint8_t> codes(size_t(rows * ld_out), 0xAB);
  std::vector<float> scales(size_t(rows * cols / 128));
  fp8_operand_rows_ref(strided.data(), rows, cols, ld_in, codes.data(), ld_out, scales.data());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float want = fmt::bits_to_float(uint32_t(in[size_t(r * cols + c)]) << 16);
      const float got = fmt::e4m3_value(codes[size_t(r * ld_out + fp8_operand_column(c))]) * scales[size_t(r * 3 + c / 128)];
      ASSERT_EQ(got, want) << "row " << r << " column " << c;
    }
    for (int64_t c = cols; c < ld_out; ++c) EXPECT_EQ(codes[size_t(r * ld_out + c)], 0xAB) << "padding written";
  }
  // A NaN turns its block's scale and bytes NaN, nothing else.
  strided[size_t(2 * ld_in + 130)] = 0x7FC0;
  fp8_operand_rows_ref(strided.data(), rows, cols, ld_in, codes.data(), ld_out, scales.data());
  EXPECT_TRUE(std::isnan(scales[2 * 3 + 1]));
  EXPECT_FALSE(std::isnan(scales[2 * 3 + 0]));
  EXPECT_FALSE(std::isnan(scales[2 * 3 + 2]));
}

// One expert's NVFP4 projection with power-of-two block scales (bytes e << 3).
LinearExpertProjection pow2_nvfp4(Rng& rng, Projection p, int64_t H, int64_t I, std::vector<uint8_t>& codes,
                                  std::vector<uint8_t>& scales, int lo, int hi) {
  const int64_t n = p == Projection::GateUp ? 2 * I : H, k = p == Projection::GateUp ? H : I;
  codes.resize(size_t(n * k / 2));
  scales.resize(size_t(n * k / 16));
  for (auto& c : codes) c = uint8_t(rng.next());
  for (auto& s : scales) s = uint8_t((lo + rng.below(hi - lo + 1)) << 3);
  return LinearExpertProjection{.format = ExpertFormat::Nvfp4, .projection = p, .hidden = H, .inter = I,
                                .codes = codes.data(), .scales = scales.data(), .expert = 7};
}

// Every nonzero weight of the rows divided by 2^E (and by the row group's
// factor, MXFP4) must be an E4M3 value.
void expect_rows_exact(const LinearExpertProjection& w, const float* factors, const std::vector<int8_t>& rows) {
  const bool mx = w.format == ExpertFormat::Mxfp4;
  const int64_t n = w.projection == Projection::GateUp ? 2 * w.inter : w.hidden;
  const int64_t k = w.projection == Projection::GateUp ? w.hidden : w.inter, block = mx ? 32 : 16;
  const FragmentGeometry g = fragment_geometry(w.projection, w.hidden, w.inter, w.format);
  for (int64_t mt = 0; mt < g.m_tiles; ++mt)
    for (int r = 0; r < 16; ++r) {
      const int64_t src = fragment_source_row(w.projection, mt, r, w.inter);
      ASSERT_LT(src, n);
      const int e = rows[size_t(mt * 16 + r)];
      const float f = mx ? factors[w.projection == Projection::GateUp && src >= w.inter ? 1 : 0] : 1.0f;
      for (int64_t c = 0; c < k; ++c) {
        const uint8_t byte = w.codes[src * k / 2 + c / 2];
        const uint8_t s = w.scales[src * (k / block) + c / block];
        const float v = fmt::e2m1_value(uint8_t(c & 1 ? byte >> 4 : byte & 15)) *
                        (mx ? fmt::ue8m0_value(s) : fmt::e4m3_value(s));
        const float a = v / (f * std::ldexp(1.0f, e));
        ASSERT_EQ(fmt::e4m3_value(fmt::e4m3_from_float(a)), a) << "row " << src << " column " << c << " E " << e;
        ASSERT_LE(std::fabs(a), 448.0f);
      }
    }
}

TEST(Fp8WeightRows, PowerOfTwoNvfp4RowsGetExactExponents) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  for (Projection p : {Projection::GateUp, Projection::Down}) {
    std::vector<uint8_t> codes, scales;
    const LinearExpertProjection w = pow2_nvfp4(rng, p, 256, 128, codes, scales, 2, 15);  // 2^-5 .. 2^8: 14 binades
    const FragmentGeometry g = fragment_geometry(p, 256, 128);
    std::vector<int8_t> rows(size_t(g.m_tiles * 16), 99);
    std::string why;
    ASSERT_TRUE(fp8_weight_rows(w, nullptr, rows.data(), &why)) << why;
    expect_rows_exact(w, nullptr, rows);
  }
}

TEST(Fp8WeightRows, Mxfp4RowsAreRelativeToTheirRowGroupFactor) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const int64_t H = 256, I = 128;
  std::vector<uint8_t> codes(size_t(2 * I * H / 2)), scales(size_t(2 * I * H / 32));
  for (auto& c : codes) c = uint8_t(rng.next());
  for (auto& s : scales) s = uint8_t(110 + rng.below(12));
  const LinearExpertProjection w{.format = ExpertFormat::Mxfp4, .projection = Projection::GateUp, .hidden = H,
                                 .inter = I, .codes = codes.data(), .scales = scales.data(), .expert = 3};
  std::vector<uint8_t> ccodes(codes.size()), mult(size_t(2 * I * H / 16));
  float factors[2] = {0, 0};
  encode_weight_scales(w, ccodes.data(), mult.data(), factors);
  const FragmentGeometry g = fragment_geometry(Projection::GateUp, H, I, ExpertFormat::Mxfp4);
  std::vector<int8_t> rows(size_t(g.m_tiles * 16));
  std::string why;
  ASSERT_TRUE(fp8_weight_rows(w, factors, rows.data(), &why)) << why;
  expect_rows_exact(w, factors, rows);
}

TEST(Fp8WeightRows, RefusesARowThatIsNotAPowerOfTwoNamingIt) {
  Rng rng(11);
  std::vector<uint8_t> codes, scales;
  LinearExpertProjection w = pow2_nvfp4(rng, Projection::Down, 256, 128, codes, scales, 5, 9);
  scales[size_t(37 * (128 / 16) + 2)] = 0x3D;  // row 37: 1.625, not a power of two
  codes[size_t(37 * 64 + 2 * 8)] = 0x22;
  std::vector<int8_t> rows(size_t(fragment_geometry(Projection::Down, 256, 128).m_tiles * 16));
  std::string why;
  EXPECT_FALSE(fp8_weight_rows(w, nullptr, rows.data(), &why));
  EXPECT_NE(why.find("expert 7"), std::string::npos) << why;
  EXPECT_NE(why.find("row 37"), std::string::npos) << why;
  EXPECT_NE(why.find("not a power of two"), std::string::npos) << why;
}

}  // namespace
}  // namespace nvfp4moe::cuda
