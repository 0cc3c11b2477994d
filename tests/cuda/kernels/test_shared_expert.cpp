// The shared expert's GEMV path (shared_expert_gemv, T <= 8) against its
// cuBLAS path: bit for bit in h where every FP32 sum is exact (small
// integers), within FP32 summation-order error elsewhere; poisoned outputs
// catch unwritten elements; which shapes take which path.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/shared_expert.hpp"
#include "cuda/kernels/shared_expert_gemv.hpp"
#include "nvfp4moe/moe.hpp"
#include "nvfp4moe/types.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

struct Shape {
  int64_t tokens, hidden, inter;
  bool limit;
};

std::vector<uint16_t> to_bf16_bits(const std::vector<float>& v) {
  std::vector<uint16_t> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_from_float(v[i]).bits;
  return b;
}

// x [T, H], w13 [2 Is, H] (gate rows, then up rows), w2 [H, Is].
struct Inputs {
  std::vector<float> x, w13, w2;
};

// The inputs of one case, drawn in that order by values(rng, count, is_weight).
template <typename Values>
Inputs make_inputs(const Shape& s, uint64_t seed, Values&& values) {
  Rng rng(seed);
  Inputs in;
  in.x = values(rng, s.tokens * s.hidden, false);
  in.w13 = values(rng, 2 * s.inter * s.hidden, true);
  in.w2 = values(rng, s.hidden * s.inter, true);
  return in;
}

std::string case_name(const Shape& s, uint64_t seed) {
  return "seed=" + std::to_string(seed) + " T=" + std::to_string(s.tokens) + " H=" + std::to_string(s.hidden) +
         " Is=" + std::to_string(s.inter);
}

struct Result {
  std::vector<uint16_t> h;  // [T, Is] bf16 bits
  std::vector<float> out;   // [T, H]
};

// One shared-expert forward on the device, outputs poisoned with NaN first.
Result run(const Shape& s, const Inputs& in, bool gemv) {
  const std::vector<float>&x = in.x, &w13 = in.w13, &w2 = in.w2;
  DeviceBuffer<uint16_t> dx(x.size()), dw13(w13.size()), dw2(w2.size()), dh(size_t(s.tokens * s.inter));
  DeviceBuffer<float> dgu(size_t(s.tokens * 2 * s.inter)), dout(size_t(s.tokens * s.hidden));
  const std::vector<uint16_t> xb = to_bf16_bits(x), w13b = to_bf16_bits(w13), w2b = to_bf16_bits(w2);
  dx.upload(xb.data(), xb.size());
  dw13.upload(w13b.data(), w13b.size());
  dw2.upload(w2b.data(), w2b.size());
  NVFP4_CUDA_CHECK(cudaMemset(dh.get(), 0xFF, dh.bytes()));    // BF16 NaN
  NVFP4_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, dout.bytes()));  // FP32 NaN
  SharedExpertArgs a;
  a.x = reinterpret_cast<const __nv_bfloat16*>(dx.get());
  a.tokens = s.tokens;
  a.hidden = s.hidden;
  a.inter = s.inter;
  a.w13 = reinterpret_cast<const __nv_bfloat16*>(dw13.get());
  a.w2 = reinterpret_cast<const __nv_bfloat16*>(dw2.get());
  a.has_limit = s.limit;
  a.limit = 7.0f;
  a.gate_up = dgu.get();
  a.h = reinterpret_cast<__nv_bfloat16*>(dh.get());
  a.out = dout.get();
  if (gemv) {
    EXPECT_TRUE(shared_expert_gemv_supports(a));
    shared_expert_gemv(a, nullptr);
  } else {
    CublasHandle handle;
    shared_expert_cublas(handle.get(), a, nullptr);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  }
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  Result r{std::vector<uint16_t>(dh.size()), std::vector<float>(dout.size())};
  dh.download(r.h.data(), r.h.size());
  dout.download(r.out.data(), r.out.size());
  return r;
}

std::vector<float> small_integers(Rng& rng, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = float(rng.below(7) - 3);
  return v;
}

class SharedGemvShapes : public ::testing::TestWithParam<Shape> {};

// Integer inputs: every gate/up sum is an exact FP32 integer in both paths,
// so h must agree bit for bit (same SwiGLU, one BF16 rounding); the down
// sums then differ only by summation order.
TEST_P(SharedGemvShapes, HBitExactAndOutWithinSummationErrorOfCublas) {
  SKIP_WITHOUT_GPU();
  const Shape s = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(case_name(s, seed));
  const Inputs in = make_inputs(s, seed, [](Rng& rng, int64_t n, bool) { return small_integers(rng, n); });
  const std::vector<float>& w2 = in.w2;
  const Result g = run(s, in, true), c = run(s, in, false);
  ASSERT_EQ(g.h.size(), c.h.size());
  for (size_t i = 0; i < g.h.size(); ++i)
    ASSERT_EQ(g.h[i], c.h[i]) << "h[" << i / size_t(s.inter) << ", " << i % size_t(s.inter) << "]";
  for (int64_t t = 0; t < s.tokens; ++t)
    for (int64_t n = 0; n < s.hidden; ++n) {
      // Sum of |h_i w_ni|: the scale of the order-dependent error (a missing
      // or doubled term would be ~bound / Is, far above 1e-5 bound).
      double bound = 0.0;
      for (int64_t i = 0; i < s.inter; ++i)
        bound += std::fabs(double(bf16_to_float(Bf16{g.h[size_t(t * s.inter + i)]})) * w2[size_t(n * s.inter + i)]);
      const float a = g.out[size_t(t * s.hidden + n)], b = c.out[size_t(t * s.hidden + n)];
      ASSERT_TRUE(std::isfinite(a)) << "out[" << t << ", " << n << "] not written (poison) or not finite";
      ASSERT_LE(std::fabs(double(a) - b), 1e-5 * bound + 1e-30) << "out[" << t << ", " << n << "]";
    }
}

// Normal inputs: the whole layer within FP32 summation-order error of the
// cuBLAS path (h may differ by one BF16 rounding where a sum sits on a tie).
TEST_P(SharedGemvShapes, RandomInputsMatchCublas) {
  SKIP_WITHOUT_GPU();
  const Shape s = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(case_name(s, seed));
  const Inputs in = make_inputs(s, seed, [](Rng& rng, int64_t n, bool weight) {
    return test::random_normal(rng, n, weight ? 0.05f : 1.0f);
  });
  const Result g = run(s, in, true), c = run(s, in, false);
  double norm = 0.0;
  for (float v : c.out) norm += double(v) * v;
  ASSERT_GT(norm, 1e-6 * double(c.out.size())) << "reference output (nearly) zero: the comparison would prove nothing";
  EXPECT_LE(test::rel_l2(g.out, c.out), 2e-3);
  int64_t h_diff = 0;
  for (size_t i = 0; i < g.h.size(); ++i) h_diff += g.h[i] != c.h[i];
  EXPECT_LE(h_diff, int64_t(g.h.size() / 50 + 1)) << "h values off by more than a rounding tie now and then";
}

INSTANTIATE_TEST_SUITE_P(Shapes, SharedGemvShapes,
                         ::testing::Values(Shape{1, 256, 64, false}, Shape{3, 1024, 96, true},
                                           Shape{8, 2080, 160, true},  // K / 32 not a multiple of 4 warps
                                           Shape{5, 64, 32, false},   // fewer chunks than warps
                                           Shape{2, 7168, 3072, true}));  // DeepSeek-V4-Pro's shared expert

TEST(SharedGemv, SupportsOnlyFewTokensAndWholeChunks) {
  SharedExpertArgs a;
  alignas(16) static uint16_t buf[8];
  a.x = a.w13 = a.w2 = reinterpret_cast<const __nv_bfloat16*>(buf);
  a.h = reinterpret_cast<__nv_bfloat16*>(buf);
  a.hidden = 7168;
  a.inter = 3072;
  for (int64_t t : {1, 8}) {
    a.tokens = t;
    EXPECT_TRUE(shared_expert_gemv_supports(a)) << "T=" << t;
  }
  a.tokens = 9;
  EXPECT_FALSE(shared_expert_gemv_supports(a)) << "T=9 is cuBLAS's";
  a.tokens = 0;
  EXPECT_FALSE(shared_expert_gemv_supports(a));
  a.tokens = 4;
  a.hidden = 208;  // 16-aligned but not 32
  EXPECT_FALSE(shared_expert_gemv_supports(a));
  a.hidden = 7168;
  a.x = reinterpret_cast<const __nv_bfloat16*>(buf + 1);  // 2-byte aligned x
  EXPECT_FALSE(shared_expert_gemv_supports(a));
  EXPECT_ERROR_CONTAINS(shared_expert_gemv(a, nullptr), "shared_expert_gemv: unsupported T=4 H=7168 Is=3072");
}

}  // namespace
}  // namespace nvfp4moe::cuda
