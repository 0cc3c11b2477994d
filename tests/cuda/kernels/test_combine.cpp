// combine_slots (vector kernel) against a host sum in slot order and against
// combine_slots_ref, bit for bit, with dead slots holding NaN (they must not
// leak), poisoned outputs, top_k above the kernel's slot batch, and the
// shapes that take the reference path.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/combine_ref.hpp"
#include "nvfp4moe/types.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

struct CombineCase {
  int64_t tokens, hidden;
  int top_k;
  bool shared;
};

std::vector<uint16_t> run_combine(const CombineCase& c, const std::vector<float>& y_pair,
                                  const std::vector<int32_t>& pos, const std::vector<float>& shared, bool ref,
                                  bool* vectorized = nullptr) {
  DeviceBuffer<float> dy(y_pair.size()), ds(std::max<size_t>(1, shared.size()));
  DeviceBuffer<int32_t> dp(pos.size());
  DeviceBuffer<__nv_bfloat16> out(size_t(c.tokens * c.hidden));
  NVFP4_CUDA_CHECK(cudaMemcpy(dy.get(), y_pair.data(), dy.bytes(), cudaMemcpyHostToDevice));
  NVFP4_CUDA_CHECK(cudaMemcpy(dp.get(), pos.data(), dp.bytes(), cudaMemcpyHostToDevice));
  if (c.shared) NVFP4_CUDA_CHECK(cudaMemcpy(ds.get(), shared.data(), shared.size() * 4, cudaMemcpyHostToDevice));
  NVFP4_CUDA_CHECK(cudaMemset(out.get(), 0xA5, out.bytes()));  // poison: 0xA5A5 is a finite BF16 no sum gives here
  CombineArgs a;
  a.y_pair = dy.get();
  a.pos_of_pair = dp.get();
  a.shared = c.shared ? ds.get() : nullptr;
  a.tokens = c.tokens;
  a.hidden = c.hidden;
  a.top_k = c.top_k;
  a.y = out.get();
  if (vectorized) *vectorized = combine_vectorized(a);
  if (ref) {
    combine_slots_ref(a, nullptr);
  } else {
    combine_slots(a, nullptr);
  }
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> h(out.size());
  NVFP4_CUDA_CHECK(cudaMemcpy(h.data(), out.get(), out.bytes(), cudaMemcpyDeviceToHost));
  return h;
}

class CombineShapes : public ::testing::TestWithParam<CombineCase> {};

TEST_P(CombineShapes, SlotOrderSumMatchesHostAndReferenceBitForBit) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const CombineCase c = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  Rng rng(seed);
  const int64_t pairs = c.tokens * c.top_k;
  std::vector<float> y_pair(size_t(pairs * c.hidden)), shared(c.shared ? size_t(c.tokens * c.hidden) : 0);
  std::vector<int32_t> pos(static_cast<size_t>(pairs));
  for (int64_t p = 0; p < pairs; ++p) {
    const bool live = rng.below(4) != 0;  // a quarter of the slots are not computed here
    pos[size_t(p)] = live ? int32_t(p) : -1;
    for (int64_t n = 0; n < c.hidden; ++n)  // dead rows hold NaN: summing one would show
      y_pair[size_t(p * c.hidden + n)] = live ? rng.normal() * std::exp2(float(rng.below(20)) - 10.0f) : NAN;
  }
  for (float& v : shared) v = rng.normal();

  std::vector<uint16_t> expect(size_t(c.tokens * c.hidden));
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t n = 0; n < c.hidden; ++n) {
      float sum = 0.0f;
      for (int j = 0; j < c.top_k; ++j)
        if (pos[size_t(t * c.top_k + j)] >= 0) sum += y_pair[size_t((t * c.top_k + j) * c.hidden + n)];
      if (c.shared) sum += shared[size_t(t * c.hidden + n)];
      expect[size_t(t * c.hidden + n)] = bf16_from_float(sum).bits;
    }

  bool vectorized = false;
  const std::vector<uint16_t> got = run_combine(c, y_pair, pos, shared, false, &vectorized);
  const std::vector<uint16_t> ref = run_combine(c, y_pair, pos, shared, true);
  EXPECT_EQ(vectorized, c.hidden % 4 == 0 && c.top_k <= 64);
  int64_t bad = 0;
  for (size_t i = 0; i < expect.size(); ++i)
    if (got[i] != expect[i] || ref[i] != expect[i]) {
      if (++bad <= 5)
        ADD_FAILURE() << "element " << i << " (token " << int64_t(i) / c.hidden << "): got 0x" << std::hex << got[i]
                      << ", reference kernel 0x" << ref[i] << ", host 0x" << expect[i];
    }
  EXPECT_EQ(bad, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CombineShapes,
                         ::testing::Values(CombineCase{37, 1024, 6, true},    // DeepSeek-like top-6, shared expert
                                           CombineCase{5, 7168, 6, false},    // V4-Pro hidden, no shared
                                           CombineCase{9, 516, 10, true},     // top_k above the slot batch of 8
                                           CombineCase{4, 1030, 3, true},     // H % 4 != 0: reference path
                                           CombineCase{3, 64, 65, true},      // top_k > 64: reference path
                                           CombineCase{1, 4, 1, false},       // one token, one vector
                                           CombineCase{1, 7172, 6, true},     // one token's columns over 8 CTAs, the last partial
                                           CombineCase{300, 2052, 8, false}), // more tokens than 2 per SM: one CTA a token
                         [](const auto& info) {
                           const CombineCase& c = info.param;
                           return "T" + std::to_string(c.tokens) + "_H" + std::to_string(c.hidden) + "_k" +
                                  std::to_string(c.top_k) + (c.shared ? "_shared" : "");
                         });

TEST(Combine, NonPositiveTopKIsAHostError) {
  CombineArgs a;
  a.tokens = 2;
  a.hidden = 8;
  a.top_k = 0;
  EXPECT_ERROR_CONTAINS(combine_slots(a, nullptr), "top_k 0", "hidden 8");
}

}  // namespace
}  // namespace nvfp4moe::cuda
