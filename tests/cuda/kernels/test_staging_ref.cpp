// GPU activation staging vs the CPU quantizer (src/format/quantize.cpp): every
// code byte, scale byte (linear and swizzled), global scale and BF16 operand
// value must be identical, on fresh random inputs with large, tiny, zero, tie
// and NaN values, for every scope.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/staging.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using cuda::ActScope;
using cuda::DeviceBuffer;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

// Rows of mixed character: normal at a random magnitude, zeros, tiny,
// huge, exact E2M1 ties under a power-of-two block factor.
std::vector<float> tricky_rows(test::Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> x(size_t(rows * cols));
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0.0f, 1.0f};
  for (int64_t r = 0; r < rows; ++r) {
    float* xr = x.data() + r * cols;
    const int kind = int(rng.below(7));
    const float mag = std::ldexp(1.0f, int(rng.below(40)) - 20);
    for (int64_t i = 0; i < cols; ++i) {
      switch (kind) {
        case 0: xr[i] = 0.0f; break;
        case 1: xr[i] = rng.normal() * 1e-30f; break;                    // subnormal-ish scales
        case 2: xr[i] = rng.normal() * 1e30f; break;                     // huge
        case 3: xr[i] = ties[rng.below(10)] * (rng.below(2) ? -1.f : 1.f) * 0.125f; break;  // ties
        default: xr[i] = rng.normal() * mag; break;
      }
    }
    if (kind == 6) {  // docs/numerics.md §2's rules inside a live row: an all-zero block (scale 0x38),
      for (int64_t i = 0; i < 16; ++i) xr[i] = 0.0f;  // a block far below the row maximum (t < 2^-9: 0x01)
      for (int64_t i = 16; i < std::min<int64_t>(cols, 32); ++i) xr[i] *= 0x1p-22f;
    }
    if (kind == 3) xr[0] = 6.0f * 0.125f;  // block amax fixed so d is a power of two in every block
    if (kind == 3)
      for (int64_t b = 0; b < cols; b += 16) xr[b] = 0.75f;
  }
  return x;
}

struct Case {
  int64_t rows, cols;
  ActScope scope;
  bool bf16;
};

void run_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(::testing::Message() << "seed=" << seed << " rows=" << c.rows << " cols=" << c.cols
                                    << " scope=" << int(c.scope) << " bf16=" << c.bf16);
  test::Rng rng(seed);
  std::vector<float> x = tricky_rows(rng, c.rows, c.cols);
  std::vector<Bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_from_float(x[i]);
  if (c.scope == ActScope::PerRow && c.rows > 2) x[size_t(c.cols + 5)] = NAN, xb[size_t(c.cols + 5)] = bf16_from_float(NAN);

  const float static_g = 1.0f / 1024.0f;  // power of two: tie rows get d = 0.125 exactly
  const ScaleScope scope = c.scope == ActScope::PerRow ? ScaleScope::PerRow
                           : c.scope == ActScope::PerTensor ? ScaleScope::PerTensor
                                                            : ScaleScope::Static;
  Nvfp4Matrix ref = c.bf16 ? quantize_matrix(xb.data(), c.rows, c.cols, scope, static_g)
                           : quantize_matrix(x.data(), c.rows, c.cols, scope, static_g);
  const int64_t k = c.cols / 16;
  std::vector<uint8_t> ref_swz(size_t(swizzled_scale_bytes(c.rows, k)));
  scales_linear_to_swizzled(ref.scales.data(), c.rows, k, ref_swz.data());

  const int64_t deq_ld = c.cols + 64;
  DeviceBuffer<float> dx(x.size());
  DeviceBuffer<uint16_t> dxb(x.size());
  DeviceBuffer<float> dg(size_t(c.rows));
  DeviceBuffer<uint8_t> dcodes(size_t(c.rows * c.cols / 2)), dlin(size_t(c.rows * k)), dswz(ref_swz.size());
  DeviceBuffer<__nv_bfloat16> ddeq(size_t(c.rows * deq_ld));
  DeviceBuffer<unsigned> scratch(1);
  dx.upload(x.data(), x.size());
  dxb.upload(reinterpret_cast<const uint16_t*>(xb.data()), xb.size());
  // Poison outputs so unwritten bytes show.
  NVFP4_CUDA_CHECK(cudaMemset(dcodes.get(), 0xA5, dcodes.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(dlin.get(), 0xA5, dlin.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(dswz.get(), 0xA5, dswz.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(ddeq.get(), 0xA5, ddeq.bytes()));

  cuda::QuantizeActArgs a;
  a.x = c.bf16 ? static_cast<const void*>(dxb.get()) : dx.get();
  a.x_is_bf16 = c.bf16;
  a.rows = c.rows;
  a.cols = c.cols;
  a.scope = c.scope;
  a.static_g = static_g;
  a.amax_scratch = scratch.get();
  a.g_out = dg.get();
  a.codes = dcodes.get();
  a.scales_linear = dlin.get();
  a.scales_swizzled = dswz.get();
  a.deq = ddeq.get();
  a.deq_ld = deq_ld;
  cuda::quantize_activations_ref(a, nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<uint8_t> codes(dcodes.size()), lin(dlin.size()), swz(dswz.size());
  std::vector<float> g(size_t(c.rows));
  std::vector<uint16_t> deq(ddeq.size());
  dcodes.download(codes.data(), codes.size());
  dlin.download(lin.data(), lin.size());
  dswz.download(swz.data(), swz.size());
  dg.download(g.data(), g.size());
  NVFP4_CUDA_CHECK(cudaMemcpy(deq.data(), ddeq.get(), ddeq.bytes(), cudaMemcpyDeviceToHost));

  EXPECT_BYTES_EQ(codes.data(), ref.codes.data(), int64_t(codes.size()), "codes");
  EXPECT_BYTES_EQ(lin.data(), ref.scales.data(), int64_t(lin.size()), "linear scales");
  EXPECT_BYTES_EQ(swz.data(), ref_swz.data(), int64_t(swz.size()), "swizzled scales (padding zero)");
  for (int64_t r = 0; r < c.rows; ++r) {
    const float gr = ref.g(r);
    uint32_t a_bits, b_bits;
    std::memcpy(&a_bits, &g[size_t(r)], 4);
    std::memcpy(&b_bits, &gr, 4);
    if (!(std::isnan(gr) && std::isnan(g[size_t(r)]))) ASSERT_EQ(a_bits, b_bits) << "global scale of row " << r;
  }
  // BF16 operand: value(q) * f32(s), exact; zero tail.
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < deq_ld; ++i) {
      float want = 0.0f;
      if (i < c.cols) {
        const uint8_t q = (ref.codes[size_t(r * c.cols / 2 + i / 2)] >> (4 * (i & 1))) & 15;
        want = fmt::e2m1_value(q) * fmt::e4m3_value(ref.scales[size_t(r * k + i / 16)]);
      }
      const Bf16 w = bf16_from_float(want);
      const uint16_t got = deq[size_t(r * deq_ld + i)];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(bf16_to_float(Bf16{got}))) << "operand (" << r << ", " << i << ") should be NaN";
      } else {
        ASSERT_EQ(got, w.bits) << "operand (" << r << ", " << i << ") want " << want;
      }
    }
}

TEST(CudaQuantize, BitExactAgainstCpuQuantizerAllScopes) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  test::Rng rng(seed);
  for (ActScope scope : {ActScope::PerRow, ActScope::PerTensor, ActScope::Static})
    for (bool bf16 : {false, true}) {
      run_case({1, 16, scope, bf16}, rng.next());
      run_case({3, 48, scope, bf16}, rng.next());
      run_case({1 + rng.below(300), 16 * (1 + rng.below(64)), scope, bf16}, rng.next());
      run_case({130, 7168, scope, bf16}, rng.next());
    }
}

TEST(CudaQuantize, BadArgumentsAreHostErrors) {
  SKIP_WITHOUT_GPU();
  cuda::QuantizeActArgs a;
  a.rows = 2;
  a.cols = 40;
  DeviceBuffer<float> g(2);
  a.g_out = g.get();
  try {
    cuda::quantize_activations_ref(a, nullptr);
    FAIL() << "K=40 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("K=40"), std::string::npos) << e.what();
  }
  a.cols = 32;
  a.scope = ActScope::Static;
  a.static_g = NAN;
  EXPECT_THROW(cuda::quantize_activations_ref(a, nullptr), Error);
}

}  // namespace
}  // namespace nvfp4moe
