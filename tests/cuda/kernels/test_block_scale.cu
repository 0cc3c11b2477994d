// block_scale (cuda/kernels/block_scale.cuh), the staging kernels' fast block
// scale, and quotient_rn, the division of the fast paths: the hardware E4M3
// conversions against the software codec on every float that can reach
// them; the whole block scale against block_scale_byte / e4m3_value (docs/
// numerics.md §2) on random and boundary blocks and on every block maximum
// of 21 binades for a set of global scales; quotient_rn against IEEE
// division on every block-maximum significand for a set of divisors (all
// 2^46 significand pairs in a disabled test). GPU machine only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/block_scale.cuh"
#include "support/block_scale_cases.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

// Mismatch count and the smallest input (as bits, or a pair index) that mismatched.
struct Mismatches {
  unsigned long long count, first;
};

__device__ void record(Mismatches* out, unsigned long long at) {
  atomicAdd(&out->count, 1ull);
  atomicMin(&out->first, at);
}

// Every non-negative finite float (bits 0 .. 0x7f7fffff): the conversion the
// fast path uses against e4m3_from_float.
__global__ void e4m3_encode_all(Mismatches* out) {
  for (uint64_t u = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < 0x7f800000ull;
       u += uint64_t(gridDim.x) * blockDim.x) {
    const float v = __uint_as_float(uint32_t(u));
    if (ptx::cvt_e4m3_from_f32_satfinite(v) != fmt::e4m3_from_float(v)) record(out, uint32_t(u));
  }
}

// Every finite non-negative scale byte: the FP16 route of block_scale against e4m3_value.
__global__ void e4m3_decode_all(Mismatches* out) {
  const uint32_t b = threadIdx.x;
  if (b > fmt::kE4M3MaxByte) return;
  const uint32_t h2 = ptx::cvt_e4m3x2_to_f16x2(uint16_t(b));
  const float got = __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
  if (__float_as_uint(got) != __float_as_uint(fmt::e4m3_value(uint8_t(b)))) record(out, b);
}

__global__ void block_scales(const float* amax, const float* g, int n, uint8_t* bytes, float* values, float* ds) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const BlockScale s = block_scale(amax[i], fmt::block_scale_divisor(g[i]));
  bytes[i] = s.byte;
  values[i] = s.value;
  ds[i] = s.d;
}

__device__ bool same_float(float a, float b) { return __float_as_uint(a) == __float_as_uint(b) || (a != a && b != b); }

// Every block maximum (bits) in [first, last) under global scale g: block_scale
// against block_scale_byte, e4m3_value and block_dequant_factor (IEEE
// division and the software codec, on the device); `slow` counts the blocks
// that missed the fast path.
__global__ void block_scale_range(float g, uint32_t first, uint32_t last, Mismatches* bad, Mismatches* slow) {
  const fmt::BlockScaleDivisor div = fmt::block_scale_divisor(g);
  for (uint64_t u = first + blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < last;
       u += uint64_t(gridDim.x) * blockDim.x) {
    const float amax = __uint_as_float(uint32_t(u));
    float v;
    if (!fmt::block_scale_quotient(amax, div, v)) record(slow, uint32_t(u));
    const BlockScale s = block_scale(amax, div);
    const uint8_t want = fmt::block_scale_byte(amax, g);
    if (s.byte != want || !same_float(s.value, fmt::e4m3_value(want)) ||
        !same_float(s.d, fmt::block_dequant_factor(want, g)))
      record(bad, uint32_t(u));
  }
}

// quotient_rn(a, D, RN(1/D)) == a / D (IEEE) for every significand of a,
// a in [1, 2), and the divisors D = 1 + (d_index[i] / 2^23); in `one`, the
// same for a single correction, RN(q + RN(a - D q) y) with q = RN(a y) (the
// alternative quotient_rn's NOTES describe). Scaling a or D by a power of
// two scales every intermediate exactly, so inside the fast path's domain
// (all intermediates normal) this covers every exponent too. Mismatches
// record (divisor index << 23) | a's mantissa bits.
__global__ void quotient_pairs(const uint32_t* d_index, uint32_t n_divisors, Mismatches* bad, Mismatches* one) {
  for (uint32_t i = blockIdx.y; i < n_divisors; i += gridDim.y) {
    const float d = __uint_as_float(0x3f800000u | d_index[i]), y = fmt::reciprocal_rn(d);
    for (uint32_t m = blockIdx.x * blockDim.x + threadIdx.x; m < (1u << 23); m += gridDim.x * blockDim.x) {
      const float a = __uint_as_float(0x3f800000u | m), want = __fdiv_rn(a, d);
      if (__float_as_uint(fmt::quotient_rn(a, d, y)) != __float_as_uint(want)) record(bad, (uint64_t(i) << 23) | m);
      const float q = fmt::mul_rn(a, y);
      if (__float_as_uint(fmt::fma_rn(fmt::fma_rn(-d, q, a), y, q)) != __float_as_uint(want))
        record(one, (uint64_t(i) << 23) | m);
    }
  }
}

Mismatches run_check(void (*kernel)(Mismatches*), unsigned grid, unsigned block) {
  DeviceBuffer<Mismatches> d(1);
  const Mismatches init{0, ~0ull};
  d.upload(&init, 1);
  kernel<<<grid, block>>>(d.get());
  NVFP4_CUDA_CHECK(cudaGetLastError());
  Mismatches h{};
  d.download(&h, 1);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  return h;
}

TEST(BlockScale, HardwareE4M3EncodeIsTheSoftwareEncodeOnEveryFiniteNonNegativeFloat) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const Mismatches m = run_check(e4m3_encode_all, 132 * 16, 256);
  EXPECT_EQ(m.count, 0u) << "first at float bits 0x" << std::hex << m.first;
}

TEST(BlockScale, HardwareE4M3DecodeIsE4M3Value) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const Mismatches m = run_check(e4m3_decode_all, 1, 128);
  EXPECT_EQ(m.count, 0u) << "first at byte 0x" << std::hex << m.first;
}

// Byte, value and d equal the host's block_scale_byte, e4m3_value and
// block_dequant_factor, bit for bit, on blocks of dynamic-like and static g,
// E4M3 rounding ties, blocks below the lower clamp and above 448, and the
// rules by hand: an all-zero block (0x38), the clamps (0x01, 0x7E), NaN marks
// (0x7F), and the fallbacks (NaN, Inf, tiny and huge maxima or g).
TEST(BlockScale, EqualsTheContractsDivisionAndSoftwareCodec) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  test::Rng rng(seed);
  std::vector<float> amax, g;
  for (int i = 0; i < 1 << 20; ++i) {
    const test::BlockScaleCase c = test::random_block_scale_case(rng);
    amax.push_back(c.amax);
    g.push_back(c.g);
  }
  struct Special {
    float amax, g;
    int byte;  // the contract's byte, or -1 where only block_scale_byte is compared
  };
  const Special specials[] = {
      {0.0f, 1.0f, 0x38},          {0.0f, 0.0123f, 0x38},        // all-zero blocks: scale 1.0
      {6.0f * 0x1p-12f, 1.0f, 0x01}, {6.0f * 0x1p-10f, 1.0f, 0x01},  // below 2^-9 (the second an E4M3 tie to 0x00)
      {6.0f * 0x1.8p-9f, 1.0f, 0x02}, {11.25f, 1.0f, 0x3F},         // a tie to the even byte; 0x3F is 1.875
      {6.0f * 448.0f, 1.0f, 0x7E},  {6.0f * 1e6f, 1.0f, 0x7E},      // at and far above 448
      {NAN, 1.0f, 0x7F},            {INFINITY, 1.0f, 0x7F},         // NaN marks, never a clamped 448
      {1.0f, NAN, 0x7F},            {1.0f, INFINITY, 0x7F},
      {0x1p-70f, 1.0f, 0x01},       {1.0f, 0x1p-70f, 0x7E},         // fallbacks: tiny maximum, tiny g
      {0x1p100f, 1.0f, 0x7E},       {1e-45f, 1e30f, 0x38},          // huge maximum; t underflows to 0
      {1e-45f, 1e-45f, -1},         {1e30f, 1.0f, 0x7E}};
  for (const Special& s : specials) {
    amax.push_back(s.amax);
    g.push_back(s.g);
    if (s.byte >= 0) EXPECT_EQ(int(fmt::block_scale_byte(s.amax, s.g)), s.byte) << "amax=" << s.amax << " g=" << s.g;
  }
  const int n = int(amax.size());
  DeviceBuffer<float> d_amax(n), d_g(n), d_values(n), d_ds(n);
  DeviceBuffer<uint8_t> d_bytes(n);
  d_amax.upload(amax.data(), n);
  d_g.upload(g.data(), n);
  block_scales<<<(n + 255) / 256, 256>>>(d_amax.get(), d_g.get(), n, d_bytes.get(), d_values.get(), d_ds.get());
  NVFP4_CUDA_CHECK(cudaGetLastError());
  std::vector<uint8_t> bytes(n);
  std::vector<float> values(n), ds(n);
  d_bytes.download(bytes.data(), n);
  d_values.download(values.data(), n);
  d_ds.download(ds.data(), n);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  int64_t bad = 0;
  for (int i = 0; i < n; ++i) {
    const uint8_t want = fmt::block_scale_byte(amax[i], g[i]);
    const float want_value = fmt::e4m3_value(want), want_d = fmt::block_dequant_factor(want, g[i]);
    auto same = [](float a, float b) { return fmt::float_to_bits(a) == fmt::float_to_bits(b) || (std::isnan(a) && std::isnan(b)); };
    if ((bytes[i] != want || !same(values[i], want_value) || !same(ds[i], want_d)) && ++bad <= 5)
      ADD_FAILURE() << std::hexfloat << "amax=" << amax[i] << " g=" << g[i] << ": byte 0x" << std::hex
                    << int(bytes[i]) << " value " << values[i] << " d " << ds[i] << ", want 0x" << int(want) << " "
                    << want_value << " " << want_d;
  }
  EXPECT_EQ(bad, 0);
}

// Every block maximum whose t = amax / f32(6 g) lies in [2^-11, 2^10) (below
// the lower clamp, every E4M3 value and tie, beyond saturation; 21 binades)
// for every g of test::exhaustive_block_scale_gs and 256 random ones (row
// maxima over 2688 and static scales): block_scale equals the IEEE reference
// on the device, and every such block takes the fast path. 5 * 10^10 blocks.
TEST(BlockScale, EqualsTheReferenceOnEveryBlockMaximum) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  test::Rng rng(seed);
  std::vector<float> gs = test::exhaustive_block_scale_gs();
  for (int i = 0; i < 256; ++i) {
    const float m = std::ldexp(1.0f + float(rng.uniform()), int(rng.below(60)) - 30);
    gs.push_back(i % 2 ? fmt::global_scale_from_amax(m) : m);
  }
  DeviceBuffer<Mismatches> d(2 * gs.size());
  std::vector<Mismatches> h(2 * gs.size(), Mismatches{0, ~0ull});
  d.upload(h.data(), h.size());
  for (size_t i = 0; i < gs.size(); ++i) {
    const auto [first, last] = test::exhaustive_block_maxima(gs[i]);
    block_scale_range<<<132 * 16, 256>>>(gs[i], first, last, d.get() + 2 * i, d.get() + 2 * i + 1);
  }
  NVFP4_CUDA_CHECK(cudaGetLastError());
  d.download(h.data(), h.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  for (size_t i = 0; i < gs.size(); ++i) {
    EXPECT_EQ(h[2 * i].count, 0u) << std::hexfloat << "g=" << gs[i] << ": first at amax bits 0x" << std::hex
                                  << h[2 * i].first;
    EXPECT_EQ(h[2 * i + 1].count, 0u) << std::hexfloat << "g=" << gs[i] << ": blocks off the fast path, first 0x"
                                      << std::hex << h[2 * i + 1].first;
  }
}

// quotient_rn (first) and a single correction (second) against IEEE
// division on every significand of the dividend for the divisor
// significands `d_index` (mantissa bits): the mismatches of each.
std::pair<Mismatches, Mismatches> quotient_mismatches(const std::vector<uint32_t>& d_index) {
  DeviceBuffer<uint32_t> di(d_index.size());
  di.upload(d_index.data(), d_index.size());
  DeviceBuffer<Mismatches> d(2);
  const Mismatches init[2] = {{0, ~0ull}, {0, ~0ull}};
  d.upload(init, 2);
  quotient_pairs<<<dim3(64, 4096), 256>>>(di.get(), uint32_t(d_index.size()), d.get(), d.get() + 1);
  NVFP4_CUDA_CHECK(cudaGetLastError());
  Mismatches h[2];
  d.download(h, 2);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  return {h[0], h[1]};
}

// quotient_rn for 2^16 divisor significands, each against all 2^23 dividend
// significands: every one within 256 ulp of the short significands 1, 1.25,
// 1.5, 1.75 and 2 (where RN(a * RN(1/D)) is most often off by more than an
// ulp), the rest evenly spaced. Half a second on an H200.
TEST(Quotient, IsTheIeeeDivisionOnEveryDividendForManyDivisors) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  std::vector<uint32_t> d_index;
  for (uint32_t m = 0; m <= 4; ++m)
    for (int s = -256; s <= 256; ++s) {
      const int64_t v = int64_t(m) * (1 << 21) + s;
      if (v >= 0 && v < (1 << 23)) d_index.push_back(uint32_t(v));
    }
  while (d_index.size() < (1u << 16)) d_index.push_back(uint32_t(d_index.size() * 131 + 7) & 0x7fffffu);
  const Mismatches m = quotient_mismatches(d_index).first;
  EXPECT_EQ(m.count, 0u) << "first: divisor mantissa 0x" << std::hex
                         << (m.count ? d_index[size_t(m.first >> 23)] : 0u) << ", dividend mantissa 0x"
                         << (m.first & 0x7fffffu);
}

// By exhaustion, all 2^46 (dividend, divisor) significand pairs: quotient_rn,
// and the single correction of its NOTES. About a minute on an H200: run
// with --gtest_also_run_disabled_tests.
TEST(Quotient, DISABLED_OneAndTwoCorrectionsAreTheIeeeDivisionOnEverySignificandPair) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  constexpr uint32_t kChunk = 1u << 16;
  for (uint32_t d0 = 0; d0 < (1u << 23); d0 += kChunk) {
    std::vector<uint32_t> d_index(kChunk);
    for (uint32_t i = 0; i < kChunk; ++i) d_index[i] = d0 + i;
    const auto [two, one] = quotient_mismatches(d_index);
    EXPECT_EQ(two.count, 0u) << "quotient_rn: divisor mantissa 0x" << std::hex << (d0 + (two.first >> 23))
                             << ", dividend mantissa 0x" << (two.first & 0x7fffffu);
    EXPECT_EQ(one.count, 0u) << "one correction: divisor mantissa 0x" << std::hex << (d0 + (one.first >> 23))
                             << ", dividend mantissa 0x" << (one.first & 0x7fffffu);
  }
}

}  // namespace
}  // namespace nvfp4moe::cuda
