// The exact integer NVFP4 x NVFP4 dots: every SIMD path this CPU has against
// the scalar reference bit for bit, the reference against FP64, the packing
// of activation rows, NaN propagation, and grouping invariance.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "cpu/nvfp4_int_dot.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

using cpu::IntDotIsa;

std::vector<IntDotIsa> available_isas() {
  std::vector<IntDotIsa> v;
  for (IntDotIsa isa : {IntDotIsa::Scalar, IntDotIsa::Avx2, IntDotIsa::Avx512})
    if (cpu::int_dot_isa_available(isa)) v.push_back(isa);
  return v;
}

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// rows x K NVFP4 weights: random codes; scale bytes finite, of both signs, subnormals included.
struct Weights {
  std::vector<uint8_t> codes, scales;
};
Weights random_weights(Rng& rng, int64_t rows, int64_t K) {
  Weights w;
  w.codes.resize(size_t(rows * K / 2));
  w.scales.resize(size_t(rows * K / 16));
  for (auto& c : w.codes) c = uint8_t(rng.next());
  for (auto& s : w.scales) {
    s = uint8_t(rng.below(0x7F));
    if (rng.below(4) == 0) s |= 0x80;
  }
  return w;
}

// m QDQ'd activation rows (values without g, as the backend stages them), packed.
struct Acts {
  std::vector<float> values, g;
  cpu::IntActRows packed;
};
Acts random_acts(Rng& rng, int64_t m, int64_t K) {
  Acts a;
  std::vector<float> x = random_normal(rng, m * K);
  for (int64_t i = 0; i < m * K; i += 16 * (1 + rng.below(5))) x[size_t(i)] *= 50.0f;  // uneven block scales
  a.values.resize(x.size());
  a.g.resize(size_t(m));
  cpu::qdq_rows(x.data(), m, K, nullptr, 0, a.values.data(), a.g.data());
  a.packed.resize(m, K);
  for (int64_t t = 0; t < m; ++t)
    EXPECT_TRUE(cpu::pack_int_act_row(a.values.data() + t * K, K, a.packed, t)) << "row " << t << " K=" << K;
  return a;
}

TEST(CpuIntDot, EveryIsaMatchesReferenceBitwiseAndReferenceMatchesF64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  EXPECT_GE(available_isas().size(), 1u);
  for (int64_t rows : {1, 3, 4, 5, 16}) {
    // Odd K: not a multiple of the 128-element chunk (tails of 16 .. 112), and some that are.
    for (int64_t K : {int64_t(16), int64_t(48), 16 * (1 + rng.below(300)), int64_t(2048)}) {
      const Weights w = random_weights(rng, rows, K);
      const int m = int(1 + rng.below(cpu::kIntDotTokens));
      const Acts a = random_acts(rng, m, K);
      std::vector<cpu::IntActRow> ar;
      for (int t = 0; t < m; ++t) ar.push_back(a.packed.row(t));
      std::vector<float> want(static_cast<size_t>(m * 16), NAN);
      cpu::int_dot_rows_tokens_ref(lut, ar.data(), m, w.codes.data(), w.scales.data(), rows, K, want.data(), 16);
      for (int t = 0; t < m; ++t)
        for (int64_t r = 0; r < rows; ++r) {
          double exact = 0, mag = 0;
          for (int64_t k = 0; k < K; ++k) {
            const uint8_t q = uint8_t((w.codes[size_t((r * K + k) / 2)] >> ((k & 1) * 4)) & 15);
            const double p = double(a.values[size_t(t * K + k)]) * e2m1_decode(q) *
                             e4m3_decode(w.scales[size_t((r * K + k) / 16)]);
            exact += p;
            mag += std::fabs(p);
          }
          ASSERT_NEAR(want[size_t(t * 16 + r)], exact, 1e-6 * mag + 1e-30)
              << "reference, rows=" << rows << " K=" << K << " token " << t << " row " << r;
        }
      for (IntDotIsa isa : available_isas()) {
        std::vector<float> got(static_cast<size_t>(m * 16), NAN);
        cpu::int_dot_rows_tokens(isa, lut, ar.data(), m, w.codes.data(), w.scales.data(), rows, K, got.data(), 16);
        for (int t = 0; t < m; ++t)
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(bits_of(got[size_t(t * 16 + r)]), bits_of(want[size_t(t * 16 + r)]))
                << cpu::int_dot_isa_name(isa) << " rows=" << rows << " K=" << K << " m=" << m << " token " << t
                << " row " << r << ": " << got[size_t(t * 16 + r)] << " vs " << want[size_t(t * 16 + r)];
      }
    }
  }
}

TEST(CpuIntDot, GroupingNeverChangesAToken) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  const int64_t rows = 7, K = 16 * (1 + rng.below(200));
  const Weights w = random_weights(rng, rows, K);
  const Acts a = random_acts(rng, cpu::kIntDotTokens, K);
  std::vector<cpu::IntActRow> ar;
  for (int t = 0; t < cpu::kIntDotTokens; ++t) ar.push_back(a.packed.row(t));
  for (IntDotIsa isa : available_isas())
    for (int m = 1; m <= cpu::kIntDotTokens; ++m) {
      std::vector<float> group(static_cast<size_t>(m * 8)), one(8);
      cpu::int_dot_rows_tokens(isa, lut, ar.data(), m, w.codes.data(), w.scales.data(), rows, K, group.data(), 8);
      for (int t = 0; t < m; ++t) {
        cpu::int_dot_rows_tokens(isa, lut, &ar[size_t(t)], 1, w.codes.data(), w.scales.data(), rows, K, one.data(), 8);
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(bits_of(group[size_t(t * 8 + r)]), bits_of(one[size_t(r)]))
              << cpu::int_dot_isa_name(isa) << " m=" << m << " token " << t << " row " << r;
      }
    }
}

TEST(CpuIntDot, PackedRowsReproduceTheValuesExactly) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const int64_t K = 16 * (1 + rng.below(100));
  const Acts a = random_acts(rng, 3, K);
  for (int64_t t = 0; t < 3; ++t) {
    const cpu::IntActRow row = a.packed.row(t);
    for (int64_t lane = 0; lane < cpu::int_chunks(K) * cpu::kIntLanes; ++lane) {
      const int64_t e0 = (lane / cpu::kIntLanes) * cpu::kIntChunk + (lane % cpu::kIntLanes) * 8;
      const float sigma = row.scale[lane] / 128.0f;
      int32_t sum = 0;
      for (int64_t e = e0; e < e0 + 8; ++e) {
        const int q = cpu::int_act_at(row, e);
        ASSERT_LE(std::abs(q), 12) << "token " << t << " element " << e;
        if (e < K) ASSERT_EQ(float(q) * sigma, a.values[size_t(t * K + e)]) << "token " << t << " element " << e;
        else ASSERT_EQ(q, 0) << "padding, token " << t << " element " << e;
        sum += q;
      }
      ASSERT_EQ(row.bias[lane], -cpu::kIntWeightBias * sum) << "token " << t << " lane " << lane;
    }
  }
  // Not NVFP4 QDQ values: Inf, and a value with more significant bits than any block scale allows.
  cpu::IntActRows p;
  p.resize(1, 16);
  std::vector<float> v(16, 1.0f);
  v[3] = INFINITY;
  EXPECT_FALSE(cpu::pack_int_act_row(v.data(), 16, p, 0));
  EXPECT_EQ(p.exact[0], 0);
  v[3] = 0.1f;
  EXPECT_FALSE(cpu::pack_int_act_row(v.data(), 16, p, 0));
  v[3] = 5.0f;  // 5 : 1 is no ratio of two 2 * E2M1 magnitudes
  EXPECT_FALSE(cpu::pack_int_act_row(v.data(), 16, p, 0));
  v[3] = 6.0f;  // 6 : 1 is (sigma 0.5: ia 12 and 2)
  EXPECT_TRUE(cpu::pack_int_act_row(v.data(), 16, p, 0));
  EXPECT_EQ(p.exact[0], 1);
  EXPECT_EQ(cpu::int_act_at(p.row(0), 3), 12);
  EXPECT_EQ(cpu::int_act_at(p.row(0), 4), 2);
  EXPECT_EQ(p.row(0).scale[0], 64.0f);
}

TEST(CpuIntDot, NanActivationBlockOrNanWeightScaleGivesNan) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  const int64_t rows = 5, K = 208;
  Weights w = random_weights(rng, rows, K);
  w.scales[size_t(1 * (K / 16) + 12)] = 0x7F;  // row 1, last block (in the tail chunk)
  w.scales[size_t(3 * (K / 16) + 2)] = 0xFF;   // row 3
  Acts a = random_acts(rng, 2, K);
  std::vector<float> nan_row(a.values.begin() + K, a.values.end());
  nan_row[20] = NAN;
  ASSERT_TRUE(cpu::pack_int_act_row(nan_row.data(), K, a.packed, 1));
  const cpu::IntActRow ar[2] = {a.packed.row(0), a.packed.row(1)};
  for (IntDotIsa isa : available_isas()) {
    std::vector<float> got(16, 0.0f);
    cpu::int_dot_rows_tokens(isa, lut, ar, 2, w.codes.data(), w.scales.data(), rows, K, got.data(), 8);
    for (int64_t r = 0; r < rows; ++r) {
      EXPECT_EQ(std::isnan(got[size_t(r)]), r == 1 || r == 3) << cpu::int_dot_isa_name(isa) << " token 0 row " << r;
      EXPECT_TRUE(std::isnan(got[size_t(8 + r)])) << cpu::int_dot_isa_name(isa) << " token 1 row " << r;
    }
  }
}

}  // namespace
}  // namespace nvfp4moe::test
