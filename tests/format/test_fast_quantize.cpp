// The fast exact quantization path of the CUDA staging kernels (nvfp4_codec.hpp:
// quotient_rn, e2m1_from_finite, the domain checks), run here on the CPU where
// every case can be compared with the spec's literal operations: x / d and
// the seven-compare E2M1 encode. The same header is compiled into the kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "common/parallel.hpp"
#include "format/nvfp4_codec.hpp"
#include "support/block_scale_cases.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::fmt {
namespace {

using test::Rng;

// Calls check(v) for every float with |v| in [2^-4, 16) (both signs: the
// whole range where the E2M1 code changes), random bit patterns over all
// floats, and the extremes; non-finite values are skipped. Returns the
// number of failures check reported.
template <typename Check>
int64_t for_test_floats(Check check) {
  int64_t bad = 0;
  auto one = [&](uint32_t bits) {
    const float v = bits_to_float(bits);
    if (is_finite(v) && !check(v) && ++bad <= 5) ADD_FAILURE() << "at 0x" << std::hex << bits;
  };
  for (uint32_t b = 0x3d800000u; b < 0x41800000u; ++b) {
    one(b);
    one(b | 0x80000000u);
  }
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (int i = 0; i < 4000000; ++i) one(uint32_t(rng.next()));
  for (uint32_t b : {0x0u, 0x80000000u, 0x1u, 0x80000001u, 0x7f7fffffu, 0xff7fffffu}) one(b);
  return bad;
}

TEST(FastQuantize, IntegerEncodeEqualsSevenCompareEncode) {
  EXPECT_EQ(for_test_floats([](float v) { return e2m1_from_finite(v) == e2m1_from_float(v); }), 0);
}

// e2m1_round_finite is the value of that code, bit for bit (sign of zero included).
TEST(FastQuantize, RoundedValueIsTheCodesValue) {
  EXPECT_EQ(for_test_floats([](float v) {
              return float_to_bits(e2m1_round_finite(v)) == float_to_bits(e2m1_value(e2m1_from_float(v)));
            }),
            0);
}

// e2m1_round_quotient is e2m1_round_finite wherever its input can come from
// quotient_rn: everything but -0, which quotient_rn never returns.
TEST(FastQuantize, QuotientRoundingIsTheFiniteRoundingButForMinusZero) {
  EXPECT_EQ(for_test_floats([](float v) {
              return float_to_bits(v) == 0x80000000u ||
                     float_to_bits(e2m1_round_quotient(v)) == float_to_bits(e2m1_round_finite(v));
            }),
            0);
  for (float d : {1.0f, 0x1p-59f, 0x1p59f, 3.5f * 0x1p-20f})
    EXPECT_EQ(float_to_bits(quotient_rn(-0.0f, d, reciprocal_rn(d))), 0u) << "d=" << d;
  EXPECT_EQ(float_to_bits(e2m1_round_quotient(-0x1p-100f)), 0x80000000u);  // tiny negatives keep -0
}

TEST(FastQuantize, IntegerEncodeHandCases) {
  // Ties go to the even code; -0 and tiny negatives keep the spec's sign rule.
  EXPECT_EQ(e2m1_from_finite(0.25f), 0);
  EXPECT_EQ(e2m1_from_finite(0.75f), 2);
  EXPECT_EQ(e2m1_from_finite(1.25f), 2);
  EXPECT_EQ(e2m1_from_finite(1.75f), 4);
  EXPECT_EQ(e2m1_from_finite(2.5f), 4);
  EXPECT_EQ(e2m1_from_finite(3.5f), 6);
  EXPECT_EQ(e2m1_from_finite(5.0f), 6);
  EXPECT_EQ(e2m1_from_finite(5.0001f), 7);
  EXPECT_EQ(e2m1_from_finite(1e30f), 7);
  EXPECT_EQ(e2m1_from_finite(-6.0f), 15);
  EXPECT_EQ(e2m1_from_finite(-0.0f), 0);
  EXPECT_EQ(e2m1_from_finite(-0.1f), 8);
  EXPECT_EQ(e2m1_from_finite(-0.26f), 9);
}

// A dequant factor as the staging kernels make it: an E4M3 scale byte times a
// global scale drawn over a wide range (both in and out of the fast domain).
float random_d(Rng& rng) {
  const uint8_t s = uint8_t(1 + rng.below(126));  // 0x01..0x7E: every finite positive E4M3
  const float g = std::ldexp(1.0f + float(rng.uniform()), int(rng.below(180)) - 90);
  return e4m3_value(s) * g;
}

// quotient_rn == x / d bit for bit wherever the domain checks accept, on
// random quotients, quotients at and around every rounding boundary of E2M1
// (the thresholds and their neighbours a few ulp away) and random elements
// over the whole accepted range.
TEST(FastQuantize, QuotientIsTheCorrectlyRoundedDivisionInItsDomain) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const float boundaries[] = {0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f, 2.0f, 2.5f, 3.0f, 3.5f, 4.0f, 5.0f, 6.0f};
  int64_t checked = 0, bad = 0;
  auto check = [&](float x, float d) {
    if (!fast_quotient_block_ok(std::fabs(x), d) || !fast_quotient_element_ok(x)) return;
    ++checked;
    const float want = x / d, got = quotient_rn(x, d, reciprocal_rn(d));
    if (float_to_bits(want) != float_to_bits(got) && ++bad <= 5)
      ADD_FAILURE() << std::hexfloat << "x=" << x << " d=" << d << ": got " << got << ", want " << want;
    if (e2m1_from_finite(got) != e2m1_from_float(want) && ++bad <= 5)
      ADD_FAILURE() << std::hexfloat << "x=" << x << " d=" << d << ": code differs";
  };
  constexpr int kIters = 10000000;
  for (int i = 0; i < kIters; ++i) {
    const float d = random_d(rng);
    // A quotient near a boundary: the boundary times d, nudged by up to 4 ulp.
    const float t = boundaries[rng.below(14)];
    float x = t * d;
    for (int k = int(rng.below(9)) - 4; k != 0; k += k > 0 ? -1 : 1) x = std::nextafter(x, k > 0 ? INFINITY : 0.0f);
    check(rng.below(2) ? x : -x, d);
    // A random quotient in [0, 8) and a random element of any accepted size.
    check(float(rng.uniform()) * 8.0f * d, d);
    check(std::ldexp(float(rng.uniform()) + 0.5f, int(rng.below(240)) - 120), d);
  }
  EXPECT_GT(checked, kIters);  // over a third of the 3 cases a round fall inside the domain
  EXPECT_EQ(bad, 0);
}

// The packed check of a BF16 pair flags exactly the values that
// fast_quotient_element_ok rejects: every BF16 bit pattern, in either half,
// next to a value that passes and one that fails.
TEST(FastQuantize, PackedBf16DomainCheckIsTheElementCheck) {
  int64_t bad = 0;
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const bool fails = !fast_quotient_element_ok(bits_to_float(h << 16));
    for (uint32_t other : {0x3f80u, 0x0001u, 0x8000u, 0x2180u, 0x217fu}) {
      const bool other_fails = !fast_quotient_element_ok(bits_to_float(other << 16));
      const uint32_t lo = bf16x2_outside_quotient_domain((other << 16 | h) & 0x7fff7fffu);
      const uint32_t hi = bf16x2_outside_quotient_domain((h << 16 | other) & 0x7fff7fffu);
      if ((((lo & 0x8000u) != 0) != fails || ((lo >> 31) != 0) != other_fails ||
           ((hi >> 31) != 0) != fails || ((hi & 0x8000u) != 0) != other_fails) &&
          ++bad <= 5)
        ADD_FAILURE() << std::hex << "h=0x" << h << " next to 0x" << other << ": lo 0x" << lo << " hi 0x" << hi;
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(bf16x2_outside_quotient_domain(0x21800000u), 0u);           // 2^-60 and 0 pass
  EXPECT_EQ(bf16x2_outside_quotient_domain(0x217f0001u), 0x80008000u);  // both just below 2^-60
}

TEST(FastQuantize, DomainRejectsWhatItCannotDivideExactly) {
  EXPECT_TRUE(fast_quotient_block_ok(6.0f, 1.0f));
  EXPECT_FALSE(fast_quotient_block_ok(0.0f, 0.0f));                   // d == 0: f32(s) * g underflowed
  EXPECT_FALSE(fast_quotient_block_ok(1.0f, 0x1p-61f));               // tiny d
  EXPECT_FALSE(fast_quotient_block_ok(1.0f, 0x1p61f));                // huge d
  EXPECT_FALSE(fast_quotient_block_ok(0x1p62f, 2.0f));                // quotient above 2^60
  EXPECT_FALSE(fast_quotient_block_ok(std::nanf(""), 1.0f));          // NaN block
  EXPECT_FALSE(fast_quotient_block_ok(INFINITY, 1.0f));               // Inf block
  EXPECT_TRUE(fast_quotient_element_ok(0.0f));
  EXPECT_TRUE(fast_quotient_element_ok(-0.0f));
  EXPECT_TRUE(fast_quotient_element_ok(0x1p-60f));
  EXPECT_TRUE(fast_quotient_element_ok(-3.0f));
  EXPECT_FALSE(fast_quotient_element_ok(0x1.fffffep-61f));
  EXPECT_FALSE(fast_quotient_element_ok(-1e-30f));
  EXPECT_FALSE(fast_quotient_element_ok(1e-45f));  // subnormal
}

// The fast block scale byte on the host, as the device forms it
// (cuda/kernels/block_scale.cuh): block_scale_quotient, then RN with
// saturation at 448 (the hardware's satfinite conversion is e4m3_from_float
// on every finite non-negative float: test_block_scale.cu), else the IEEE
// reference.
uint8_t fast_block_scale_byte(float amax, const BlockScaleDivisor& div) {
  float v;
  return block_scale_quotient(amax, div, v) ? e4m3_from_float(v) : block_scale_byte(amax, div.g);
}

// clamp(t_b) of docs/numerics.md §2 with IEEE division, t_b = 0 -> 1.
float ieee_clamped_quotient(float amax, float g) {
  const float t = amax / (6.0f * g);
  return clamp_block_scale(t == 0.0f ? 1.0f : t);
}

// block_scale_quotient == clamp(amax_b / f32(6 g)) bit for bit wherever it
// accepts (below 448: the conversion saturates above), so its E4M3 byte is
// block_scale_byte's; it accepts every block of a sane row (amax_b in
// [2^-55, 2^55], g as a row maximum / 2688 makes it) and refuses NaN, Inf,
// tiny and huge amax_b or g.
TEST(FastQuantize, BlockScaleQuotientIsTheOneDivision) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  int64_t bad = 0, accepted = 0;
  constexpr int kIters = 2000000;
  for (int i = 0; i < kIters; ++i) {
    const auto [amax, g] = test::random_block_scale_case(rng);
    const BlockScaleDivisor div = block_scale_divisor(g);
    if (fast_block_scale_byte(amax, div) != block_scale_byte(amax, g) && ++bad <= 5)
      ADD_FAILURE() << std::hexfloat << "amax=" << amax << " g=" << g << ": byte 0x" << std::hex
                    << int(fast_block_scale_byte(amax, div)) << ", want 0x" << int(block_scale_byte(amax, g));
    if (!is_finite(amax)) continue;
    float v = -1.0f;
    if (!block_scale_quotient(amax, div, v)) {
      if (amax >= 0x1p-55f && amax <= 0x1p55f && g >= 0x1p-55f && g <= 0x1p55f && amax <= g * 0x1p55f &&
          ++bad <= 5)
        ADD_FAILURE() << std::hexfloat << "refused amax=" << amax << " g=" << g;
      continue;
    }
    ++accepted;
    const float want = ieee_clamped_quotient(amax, g);
    if (float_to_bits(std::fmin(v, kE4M3Max)) != float_to_bits(want) && ++bad <= 5)
      ADD_FAILURE() << std::hexfloat << "amax=" << amax << " g=" << g << ": got " << v << ", want " << want;
  }
  EXPECT_GT(accepted, kIters / 2);
  EXPECT_EQ(bad, 0);
  float v = 0.0f;
  const BlockScaleDivisor one = block_scale_divisor(1.0f);
  EXPECT_TRUE(block_scale_quotient(0.0f, one, v));  // an all-zero block: scale 1.0
  EXPECT_EQ(v, 1.0f);
  EXPECT_TRUE(block_scale_quotient(0x1p-40f, one, v));  // a tiny block: clamped up to 2^-9
  EXPECT_EQ(v, 0x1p-9f);
  EXPECT_FALSE(block_scale_quotient(std::nanf(""), one, v));
  EXPECT_FALSE(block_scale_quotient(INFINITY, one, v));
  EXPECT_FALSE(block_scale_quotient(1.0f, block_scale_divisor(std::nanf("")), v));
  EXPECT_FALSE(block_scale_quotient(1.0f, block_scale_divisor(INFINITY), v));
  EXPECT_FALSE(block_scale_quotient(0x1p-70f, one, v));                      // tiny block maximum
  EXPECT_FALSE(block_scale_quotient(1.0f, block_scale_divisor(0x1p-70f), v));  // tiny g
  EXPECT_FALSE(block_scale_quotient(0x1p100f, one, v));                      // huge block maximum
  EXPECT_FALSE(block_scale_quotient(1.0f, block_scale_divisor(0x1p70f), v));   // huge g
}

// Every block maximum whose t = amax / f32(6 g) lies in [2^-11, 2^10) — below
// the lower clamp, every E4M3 value and tie, beyond saturation — for the
// first test::kCpuExhaustiveGs global scales of exhaustive_block_scale_gs
// (test_block_scale.cu takes them all on the GPU): the fast byte is
// block_scale_byte's, and the fast path takes them all. 7 * 10^8 blocks,
// split over the cores.
TEST(FastQuantize, BlockScaleByteOnEveryBlockMaximum) {
  const std::vector<float> all = test::exhaustive_block_scale_gs();
  for (float g : std::vector<float>(all.begin(), all.begin() + test::kCpuExhaustiveGs)) {
    SCOPED_TRACE(testing::Message() << std::hexfloat << "g=" << g);
    const BlockScaleDivisor div = block_scale_divisor(g);
    const auto [first, last] = test::exhaustive_block_maxima(g);
    std::vector<int64_t> bad(size_t(thread_count()), 0), slow(bad.size(), 0);
    std::vector<uint32_t> first_bad(bad.size(), 0);
    const int64_t n = int64_t(last - first), chunk = (n + int64_t(bad.size()) - 1) / int64_t(bad.size());
    parallel_for(int64_t(bad.size()), 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        for (uint32_t u = first + uint32_t(c * chunk); u < first + uint32_t(std::min(n, (c + 1) * chunk)); ++u) {
          const float amax = bits_to_float(u);
          float v;
          slow[size_t(c)] += !block_scale_quotient(amax, div, v);
          if (fast_block_scale_byte(amax, div) != block_scale_byte(amax, g) && bad[size_t(c)]++ == 0)
            first_bad[size_t(c)] = u;
        }
    });
    for (size_t c = 0; c < bad.size(); ++c) {
      EXPECT_EQ(bad[c], 0) << "first at amax bits 0x" << std::hex << first_bad[c];
      EXPECT_EQ(slow[c], 0) << "blocks outside the fast path";
    }
  }
}

// The zero-block rule, the clamps and the NaN marks of block_scale_byte by
// hand (docs/numerics.md §2).
TEST(FastQuantize, BlockScaleByteRules) {
  EXPECT_EQ(block_scale_byte(0.0f, 1.0f), 0x38);            // all-zero block: 1.0
  EXPECT_EQ(block_scale_byte(0.0f, 0.0123f), 0x38);
  EXPECT_EQ(block_scale_byte(6.0f * 0x1p-12f, 1.0f), 0x01);  // t = 2^-12: clamped up to 2^-9
  EXPECT_EQ(block_scale_byte(6.0f * 0x1p-10f, 1.0f), 0x01);  // t = 2^-10, an E4M3 tie with 0: 2^-9, not 0
  EXPECT_EQ(block_scale_byte(6.0f * 0x1p-9f, 1.0f), 0x01);
  EXPECT_EQ(block_scale_byte(6.0f * 0x1.8p-9f, 1.0f), 0x02);  // 1.5 * 2^-9: tie, to the even byte
  EXPECT_EQ(block_scale_byte(6.0f * 448.0f, 1.0f), 0x7E);
  EXPECT_EQ(block_scale_byte(6.0f * 1e6f, 1.0f), 0x7E);      // far above 448 (a static g): saturated
  EXPECT_EQ(block_scale_byte(1e-45f, 1e30f), 0x38);          // t underflows to 0: the zero rule, as ModelOpt
  EXPECT_EQ(block_scale_byte(INFINITY, 1.0f), 0x7F);         // an Inf element: NaN, not 448
  EXPECT_EQ(block_scale_byte(std::nanf(""), 1.0f), 0x7F);
  EXPECT_EQ(block_scale_byte(1.0f, std::nanf("")), 0x7F);    // a NaN scope: every block
  EXPECT_EQ(block_scale_byte(0.0f, INFINITY), 0x7F);
}

// Whole blocks: quantize_block_codes == quantize_element per element and
// quantize_block_values == its value times f32(s), on
// blocks that take the fast path, blocks that fall back (a tiny element, NaN,
// Inf, zero, huge or tiny d) and blocks mixing both kinds of element.
TEST(FastQuantize, BlockCodesEqualQuantizeElement) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  int64_t bad = 0;
  for (int it = 0; it < 200000; ++it) {
    float x[kBlock];
    const float mag = std::ldexp(1.0f, int(rng.below(200)) - 100);
    for (float& v : x) v = rng.normal() * mag;
    switch (rng.below(8)) {
      case 0: x[rng.below(kBlock)] = 0x1p-70f; break;             // one tiny element: fallback
      case 1: x[rng.below(kBlock)] = std::nanf(""); break;          // NaN block
      case 2: x[rng.below(kBlock)] = -INFINITY; break;              // Inf block
      case 3: for (float& v : x) v = 0.0f; break;                   // zero block: scale 1.0, d == g
      case 4: x[rng.below(kBlock)] = 0.0f; x[rng.below(kBlock)] = -0.0f; break;  // zeros stay fast
      default: break;
    }
    float amax = 0.0f;
    for (float v : x) amax = abs_max_nan(amax, v);
    const float g = rng.below(2) ? global_scale_from_amax(amax * float(1 + rng.below(4)))
                                 : std::ldexp(1.0f, int(rng.below(60)) - 30);  // dynamic-like or static
    const uint8_t s = block_scale_byte(amax, is_finite(g) ? g : 1.0f);
    const float d = block_dequant_factor(s, is_finite(g) ? g : 1.0f);
    uint32_t packed[2] = {0xdeadbeefu, 0xdeadbeefu};
    quantize_block_codes(x, amax, d, packed);
    const float sv = e4m3_value(s);
    float values[kBlock];
    quantize_block_values(x, amax, d, sv, values);
    for (int i = 0; i < kBlock; ++i) {
      const int q = int(packed[i / 8] >> (4 * (i % 8))) & 15;
      if (q != quantize_element(x[i], d) && ++bad <= 5)
        ADD_FAILURE() << std::hexfloat << "x=" << x[i] << " d=" << d << ": got " << q << ", want "
                      << int(quantize_element(x[i], d));
      const float want = e2m1_value(quantize_element(x[i], d)) * sv;
      if (float_to_bits(values[i]) != float_to_bits(want) && !(std::isnan(values[i]) && std::isnan(want)) &&
          ++bad <= 5)
        ADD_FAILURE() << std::hexfloat << "x=" << x[i] << " d=" << d << ": value " << values[i] << ", want " << want;
    }
  }
  EXPECT_EQ(bad, 0);
}

}  // namespace
}  // namespace nvfp4moe::fmt
