// block_scale (cuda/block_scale.cuh), the staging kernels' fast block scale:
// its hardware E4M3 conversions against the software codec on every float
// that can reach them, and the whole function against block_scale_byte /
// e4m3_value on random and boundary blocks. GPU machine only.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/block_scale.cuh"
#include "support/block_scale_cases.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

// Mismatch count and the smallest input (as bits) that mismatched.
struct Mismatches {
  unsigned long long count;
  unsigned int first;
};

// Every non-negative finite float (bits 0 .. 0x7f7fffff): the conversion the
// fast path uses against e4m3_from_float.
__global__ void e4m3_encode_all(Mismatches* out) {
  for (uint64_t u = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; u < 0x7f800000ull;
       u += uint64_t(gridDim.x) * blockDim.x) {
    const float v = __uint_as_float(uint32_t(u));
    if (ptx::cvt_e4m3_from_f32_satfinite(v) != fmt::e4m3_from_float(v)) {
      atomicAdd(&out->count, 1ull);
      atomicMin(&out->first, uint32_t(u));
    }
  }
}

// Every finite non-negative scale byte: the FP16 route of block_scale against e4m3_value.
__global__ void e4m3_decode_all(Mismatches* out) {
  const uint32_t b = threadIdx.x;
  if (b > fmt::kE4M3MaxByte) return;
  const uint32_t h2 = ptx::cvt_e4m3x2_to_f16x2(uint16_t(b));
  const float got = __half2float(__ushort_as_half(uint16_t(h2 & 0xffffu)));
  if (__float_as_uint(got) != __float_as_uint(fmt::e4m3_value(uint8_t(b)))) {
    atomicAdd(&out->count, 1ull);
    atomicMin(&out->first, b);
  }
}

__global__ void block_scales(const float* amax, const float* g, int n, uint8_t* bytes, float* values, float* ds) {
  const int i = int(blockIdx.x * blockDim.x + threadIdx.x);
  if (i >= n) return;
  const BlockScale s = block_scale(amax[i], g[i], fmt::reciprocal_rn(g[i]));
  bytes[i] = s.byte;
  values[i] = s.value;
  ds[i] = s.d;
}

Mismatches run_check(void (*kernel)(Mismatches*), unsigned grid, unsigned block) {
  DeviceBuffer<Mismatches> d(1);
  const Mismatches init{0, 0xffffffffu};
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

// Byte, value and d equal block_scale_byte, e4m3_value and
// block_dequant_factor, bit for bit, on blocks of dynamic-like and static g,
// E4M3 rounding ties, zero blocks and the fallbacks (NaN, Inf, tiny and huge
// maxima or g).
TEST(BlockScale, EqualsTheSpecsTwoDivisionsAndSoftwareCodec) {
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
  const float specials[][2] = {{0.0f, 1.0f},      {NAN, 1.0f},       {INFINITY, 1.0f}, {1.0f, NAN},
                               {1.0f, INFINITY},  {0x1p-70f, 1.0f},  {1.0f, 0x1p-70f}, {0x1p100f, 1.0f},
                               {1e-45f, 1e-45f},  {448.0f * 6, 1.0f}, {1e30f, 1.0f}};
  for (const auto& s : specials) {
    amax.push_back(s[0]);
    g.push_back(s[1]);
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

}  // namespace
}  // namespace nvfp4moe::cuda
