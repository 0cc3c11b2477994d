// The dispatched SIMD kernels against their scalar references: NVFP4 tile
// dequantization bit for bit (value(q) * f32(s) is exact), dots to FP32
// rounding, BF16 widening bit for bit; plus the router math's contracts.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.hpp"
#include "cpu/cpu_moe.hpp"
#include "moe/router_math.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

// Every ISA this CPU has: each kernel is tested in each.
std::vector<cpu::CpuIsa> available_isas() {
  std::vector<cpu::CpuIsa> v;
  for (cpu::CpuIsa isa : {cpu::CpuIsa::Scalar, cpu::CpuIsa::Avx2, cpu::CpuIsa::Avx512})
    if (cpu::cpu_isa_available(isa)) v.push_back(isa);
  return v;
}

// An exact conversion in every ISA: run(isa, out) fills out (poisoned
// first), which must equal `want` byte for byte.
template <class Run>
void expect_every_isa_writes(const std::vector<float>& want, const std::string& what, Run run) {
  for (cpu::CpuIsa isa : available_isas()) {
    std::vector<float> got(want.size(), 1.0f);
    run(isa, got.data());
    EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(got.data()), reinterpret_cast<const uint8_t*>(want.data()),
                    int64_t(got.size() * 4), what + ", " + cpu::cpu_isa_name(isa));
  }
}

// Random codes of n rows x K with one scale byte per `block` elements, the
// first 256 scales every byte value (NaN ones too).
struct CodeTile {
  std::vector<uint8_t> codes, scales;
};
CodeTile every_scale_tile(Rng& rng, int64_t n, int64_t K, int64_t block) {
  CodeTile t{std::vector<uint8_t>(static_cast<size_t>(n * K / 2)),
             std::vector<uint8_t>(static_cast<size_t>(n * K / block))};
  for (auto& c : t.codes) c = uint8_t(rng.next());
  for (size_t i = 0; i < t.scales.size(); ++i) t.scales[i] = uint8_t(i < 256 ? i : rng.next());
  return t;
}

// The reference tile is the spec: element i = value(code i) (element 2j in
// the low nibble of byte j) times its block's scale, as the codec gives it.
template <class Value>
void expect_tile_is_the_codec(const std::vector<float>& tile, const CodeTile& t, int64_t block, Value value) {
  for (size_t i = 0; i < tile.size(); ++i) {
    const uint8_t q = uint8_t((t.codes[i / 2] >> ((i & 1) * 4)) & 15);
    const float want = value(q, t.scales[i / size_t(block)]);
    if (std::isnan(want)) ASSERT_TRUE(std::isnan(tile[i])) << "element " << i;
    else ASSERT_EQ(fmt::float_to_bits(tile[i]), fmt::float_to_bits(want)) << "element " << i;
  }
}

// NVFP4 tiles (UE4M3 per 16) and MXFP4 tiles (UE8M0 per 32: 0x00 is
// 2^-127, 0xFF NaN): every code under every scale byte, the reference
// against the codec and each ISA bit for bit against the reference.
TEST(CpuKernels, DequantMatchesReferenceBitwiseOnEveryCodeAndScale) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  using Ref = void (*)(const cpu::E2m1PairTable&, const uint8_t*, const uint8_t*, int64_t, int64_t, float*);
  using Isa = void (*)(cpu::CpuIsa, const cpu::E2m1PairTable&, const uint8_t*, const uint8_t*, int64_t, int64_t,
                       float*);
  using Value = float (*)(uint8_t, uint8_t);
  const struct {
    const char* name;
    int64_t n, K, block;
    Ref ref;
    Isa isa;
    Value value;
  } formats[] = {
      {"nvfp4", 7, 4096, 16, cpu::dequant_rows_noglobal_ref, cpu::dequant_rows_noglobal,
       [](uint8_t q, uint8_t s) { return e2m1_decode(q) * e4m3_decode(s); }},
      {"mxfp4", 5, 2048, 32, cpu::dequant_mxfp4_rows_ref, cpu::dequant_mxfp4_rows,
       [](uint8_t q, uint8_t s) { return fmt::mxfp4_value(q, s); }},
  };
  for (const auto& f : formats) {
    SCOPED_TRACE(f.name);
    const CodeTile t = every_scale_tile(rng, f.n, f.K, f.block);
    std::vector<float> b(static_cast<size_t>(f.n * f.K), 2.0f);
    f.ref(lut, t.codes.data(), t.scales.data(), f.n, f.K, b.data());
    expect_tile_is_the_codec(b, t, f.block, f.value);
    expect_every_isa_writes(b, std::string(f.name) + " dequant vs ref", [&](cpu::CpuIsa isa, float* out) {
      f.isa(isa, lut, t.codes.data(), t.scales.data(), f.n, f.K, out);
    });
  }
}

// Block-scaled FP8 rows: every E4M3 byte (0x7F / 0xFF NaN, subnormals)
// under scales of several binades, a partial last tile and a K that is not
// a multiple of 8; each ISA bit for bit against the reference, and the
// reference against the codec's e4m3_value times the scale.
TEST(CpuKernels, Fp8RowWideningMatchesReferenceBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  for (const int64_t K : {int64_t(512), int64_t(400), int64_t(7168), int64_t(20)}) {
    std::vector<uint8_t> w(static_cast<size_t>(K));
    for (size_t i = 0; i < w.size(); ++i) w[i] = uint8_t(i < 256 && K >= 256 ? i : rng.next());
    std::vector<float> scales(static_cast<size_t>((K + 127) / 128));
    for (auto& v : scales) v = std::ldexp(1.0f + float(rng.below(1000)) / 1000.0f, int(rng.below(60)) - 30);
    std::vector<float> want(static_cast<size_t>(K));
    cpu::widen_fp8_row_ref(lut, w.data(), scales.data(), K, want.data());
    for (int64_t k = 0; k < K; ++k) {
      const float v = e4m3_decode(w[size_t(k)]) * scales[size_t(k / 128)];
      if (std::isnan(v)) ASSERT_TRUE(std::isnan(want[size_t(k)])) << "K=" << K << " k=" << k;
      else ASSERT_EQ(want[size_t(k)], v) << "K=" << K << " k=" << k;
    }
    expect_every_isa_writes(want, "widen_fp8_row, K=" + std::to_string(K), [&](cpu::CpuIsa isa, float* out) {
      cpu::widen_fp8_row(isa, lut, w.data(), scales.data(), K, out);
    });
  }
}

TEST(CpuKernels, DotsMatchReferenceAndWideningIsExact) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  for (cpu::CpuIsa isa : available_isas()) {
    for (int64_t rows : {1, 3, 4, 9, 16}) {
      SCOPED_TRACE(cpu::cpu_isa_name(isa));
      const int64_t K = 16 * (1 + rng.below(300));
      const std::vector<float> a = random_normal(rng, K), w = random_normal(rng, rows * K);
      std::vector<float> got(static_cast<size_t>(rows), NAN), want(static_cast<size_t>(rows));
      cpu::dot_rows(isa, a.data(), w.data(), rows, K, got.data());
      cpu::dot_rows_ref(a.data(), w.data(), rows, K, want.data());
      for (int64_t r = 0; r < rows; ++r) {
        double exact = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          exact += double(a[size_t(k)]) * double(w[size_t(r * K + k)]);
          mag += std::fabs(double(a[size_t(k)]) * double(w[size_t(r * K + k)]));
        }
        // FP32 sums in different orders: each within 1e-6 of sum |a_k w_k| of
        // the exact dot, so within 2e-6 of each other. A bound relative to the
        // result itself fails on rows whose terms cancel (seed 4614310724252396694).
        EXPECT_NEAR(got[size_t(r)], exact, 1e-6 * mag) << "rows=" << rows << " K=" << K << " row " << r;
        EXPECT_NEAR(want[size_t(r)], exact, 1e-6 * mag) << "reference, rows=" << rows << " K=" << K << " row " << r;
        EXPECT_NEAR(got[size_t(r)], want[size_t(r)], 2e-6 * mag) << "rows=" << rows << " K=" << K << " row " << r;
      }
    }
  }
  std::vector<Bf16> h(1000);
  for (auto& v : h) v = Bf16{uint16_t(rng.next())};
  std::vector<float> f2(h.size());
  cpu::widen_bf16_ref(h.data(), int64_t(h.size()), f2.data());
  expect_every_isa_writes(f2, "widen_bf16", [&](cpu::CpuIsa isa, float* out) {
    cpu::widen_bf16(isa, h.data(), int64_t(h.size()), out);
  });
}

TEST(CpuKernels, MultiTokenDotsEqualSingleTokenDotsBitwise) {
  // Grouping must never change a token's result (EP ranks group differently).
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  for (int64_t rows : {4, 16, 7}) {
    const int64_t K = 16 * (1 + rng.below(200));
    const std::vector<float> w = random_normal(rng, rows * K);
    std::vector<std::vector<float>> a;
    for (int t = 0; t < cpu::kDotTokens; ++t) a.push_back(random_normal(rng, K));
    for (cpu::CpuIsa isa : available_isas()) {
      for (int m = 1; m <= cpu::kDotTokens; ++m) {
        SCOPED_TRACE(cpu::cpu_isa_name(isa));
        const float* ap[cpu::kDotTokens];
        for (int t = 0; t < m; ++t) ap[t] = a[size_t(t)].data();
        std::vector<float> got(static_cast<size_t>(m * 20), NAN), one(static_cast<size_t>(rows));
        cpu::dot_rows_tokens(isa, ap, m, w.data(), rows, K, got.data(), 20);
        for (int t = 0; t < m; ++t) {
          cpu::dot_rows(isa, a[size_t(t)].data(), w.data(), rows, K, one.data());
          for (int64_t r = 0; r < rows; ++r)
            ASSERT_EQ(got[size_t(t * 20 + r)], one[size_t(r)]) << "m=" << m << " token " << t << " row " << r;
        }
      }
    }
  }
}

// In every ISA and for every group of up to kDotTokens tokens, the fused
// dots fused(isa, tokens, m, out) equal dot_rows_tokens on the converted
// tile bit for bit.
template <class Fused>
void expect_fused_dots_equal_tile_dots(const std::vector<std::vector<float>>& a, const std::vector<float>& tile,
                                       int64_t rows, int64_t K, Fused fused) {
  for (cpu::CpuIsa isa : available_isas()) {
    for (int m = 1; m <= cpu::kDotTokens; ++m) {
      SCOPED_TRACE(cpu::cpu_isa_name(isa));
      const float* ap[cpu::kDotTokens];
      for (int t = 0; t < m; ++t) ap[t] = a[size_t(t)].data();
      std::vector<float> got(static_cast<size_t>(m * 16), NAN), split(static_cast<size_t>(m * 16), NAN);
      fused(isa, ap, m, got.data());
      cpu::dot_rows_tokens(isa, ap, m, tile.data(), rows, K, split.data(), 16);
      for (int t = 0; t < m; ++t)
        for (int64_t r = 0; r < rows; ++r)
          ASSERT_EQ(got[size_t(t * 16 + r)], split[size_t(t * 16 + r)]) << "m=" << m << " token " << t << " row " << r;
    }
  }
}

TEST(CpuKernels, FusedNvfp4DotsEqualDequantThenDotBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  for (int64_t rows : {16, 4, 6, 5}) {  // 5 rows of an odd K / 16: codes end in half a 16-byte group
    const int64_t K = rows == 5 ? 16 * (1 + 2 * rng.below(100)) : 16 * (1 + rng.below(200));
    std::vector<uint8_t> codes(static_cast<size_t>(rows * K / 2)), scales(static_cast<size_t>(rows * K / 16));
    for (auto& c : codes) c = uint8_t(rng.next());
    for (auto& b : scales) b = uint8_t(rng.below(0x7F));  // finite scales
    std::vector<std::vector<float>> a;
    for (int t = 0; t < cpu::kDotTokens; ++t) a.push_back(random_normal(rng, K));
    std::vector<float> tile(static_cast<size_t>(rows * K)), scratch(static_cast<size_t>(rows * K));
    cpu::dequant_rows_noglobal_ref(lut, codes.data(), scales.data(), rows, K, tile.data());
    auto fused = [&](cpu::CpuIsa isa, const float* const* ap, int m, float* out) {
      cpu::nvfp4_dot_rows_tokens(isa, lut, ap, m, codes.data(), scales.data(), rows, K, out, 16, scratch.data());
    };
    expect_fused_dots_equal_tile_dots(a, tile, rows, K, fused);
  }
}

// MXFP4 rows, UE8M0 bytes 0x00 .. 0xE3 in turn (factors 2^-127 .. 2^100,
// the smallest products subnormal; larger ones would overflow the sums to
// NaN), a zero activation among them.
TEST(CpuKernels, FusedMxfp4DotsEqualDequantThenDotBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const cpu::E2m1PairTable lut;
  for (int64_t rows : {16, 4, 5}) {
    const int64_t K = 32 * (1 + rng.below(100));
    std::vector<uint8_t> codes(static_cast<size_t>(rows * K / 2)), scales(static_cast<size_t>(rows * K / 32));
    for (auto& c : codes) c = uint8_t(rng.next());
    for (size_t i = 0; i < scales.size(); ++i) scales[i] = uint8_t(i % 0xE4);
    std::vector<std::vector<float>> a;
    for (int t = 0; t < cpu::kDotTokens; ++t) a.push_back(random_normal(rng, K));
    a[0][size_t(rng.below(K))] = 0.0f;
    std::vector<float> tile(static_cast<size_t>(rows * K)), scratch(static_cast<size_t>(rows * K));
    cpu::dequant_mxfp4_rows_ref(lut, codes.data(), scales.data(), rows, K, tile.data());
    auto fused = [&](cpu::CpuIsa isa, const float* const* ap, int m, float* out) {
      cpu::mxfp4_dot_rows_tokens(isa, lut, ap, m, codes.data(), scales.data(), rows, K, out, 16, scratch.data());
    };
    expect_fused_dots_equal_tile_dots(a, tile, rows, K, fused);
  }
}

TEST(CpuKernels, FusedBf16DotsEqualWidenThenDotBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  for (int64_t rows : {16, 5}) {
    const int64_t K = 16 * (1 + rng.below(100));
    std::vector<Bf16> w(static_cast<size_t>(rows * K));
    for (auto& v : w) v = bf16_from_float(rng.normal());
    std::vector<float> wide(w.size()), scratch(w.size());
    cpu::widen_bf16_ref(w.data(), int64_t(w.size()), wide.data());
    std::vector<std::vector<float>> a;
    for (int t = 0; t < cpu::kDotTokens; ++t) a.push_back(random_normal(rng, K));
    auto fused = [&](cpu::CpuIsa isa, const float* const* ap, int m, float* out) {
      cpu::bf16_dot_rows_tokens(isa, ap, m, w.data(), rows, K, out, 16, scratch.data());
    };
    expect_fused_dots_equal_tile_dots(a, wide, rows, K, fused);
  }
}

TEST(RouterMath, ScoresTopkAndWeightsFollowTheSpec) {
  // softplus switches to identity above 20; sqrt in double rounded once.
  EXPECT_EQ(router::sqrt_softplus_score(25.0f), float(std::sqrt(25.0)));
  EXPECT_EQ(router::sqrt_softplus_score(0.0f), float(std::sqrt(std::log(2.0))));
  EXPECT_EQ(router::sqrt_softplus_score(-30.0f), float(std::sqrt(std::log1p(std::exp(-30.0)))));
  EXPECT_TRUE(std::isnan(router::sqrt_softplus_score(NAN)));
  // Ties go to the lower id; NaN keys rank last.
  float keys[3];
  int ids[3], filled = 0;
  const float in_keys[] = {1.0f, 2.0f, NAN, 2.0f, 0.5f, 2.0f};
  for (int e = 5; e >= 0; --e)  // insertion order must not matter
    router::topk_insert(router::selection_key(in_keys[e], 0.0f), e, 3, keys, ids, filled);
  EXPECT_EQ(filled, 3);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 3);
  EXPECT_EQ(ids[2], 5);
  // w_j = rho * s_j / sum s.
  const float s[] = {1.0f, 3.0f};
  float w[2];
  router::topk_weights(s, 2, 1.5f, true, w);
  EXPECT_EQ(w[0], 0.375f);
  EXPECT_EQ(w[1], 1.125f);
  router::topk_weights(s, 2, 1.5f, false, w);
  EXPECT_EQ(w[1], 4.5f);
  // Logit: exact float products summed in double, rounded once — any order.
  std::vector<float> x = {1e8f, 1.0f, -1e8f, 3.0f}, g = {1.0f, 1.0f, 1.0f, 1.0f};
  x.resize(16, 0.0f);
  g.resize(16, 0.0f);
  EXPECT_EQ(cpu::router_logit(x.data(), g.data(), 16), 4.0f);
}

TEST(CpuKernels, RouterLogitsMatchReferenceBitwise) {
  const uint64_t seed = fresh_seed();
  Rng rng(seed);
  for (const int64_t hidden : {int64_t(4096), int64_t(4100), int64_t(7)})
    for (const int64_t experts : {int64_t(1), int64_t(7), int64_t(256)}) {
      SCOPED_TRACE(::testing::Message() << "seed=" << seed << " hidden=" << hidden << " experts=" << experts);
      // Wide magnitudes, so the double sums carry many binades and cancel.
      std::vector<float> x = random_normal(rng, hidden), g = random_normal(rng, experts * hidden);
      for (auto& v : x) v = std::ldexp(v, int(rng.below(40)) - 20);
      for (auto& v : g) v = std::ldexp(v, int(rng.below(40)) - 20);
      std::vector<float> a(static_cast<size_t>(experts)), b(static_cast<size_t>(experts));
      cpu::router_logits(x.data(), g.data(), experts, hidden, a.data());
      cpu::router_logits_ref(x.data(), g.data(), experts, hidden, b.data());
      EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(a.data()), reinterpret_cast<const uint8_t*>(b.data()),
                      experts * 4, "router_logits vs ref");
    }
}

}  // namespace
}  // namespace nvfp4moe::test
