// DeviceSharedExpert with FP8 weights takes x where the caller has it: a
// BF16 x that is not 16-byte aligned gives the same output as an aligned
// copy of it (the kernels read 16 bytes at a time, so it is copied first).
#include <gtest/gtest.h>

#include <vector>

#include "cuda/backend/device_shared_expert.hpp"
#include "cuda/cuda_check.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/shared_fp8_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

TEST(DeviceSharedExpert, Fp8TakesUnalignedBf16Input) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const MoeConfig cfg = small_demo_config();
  const int64_t T = 5, H = cfg.hidden;
  const SharedExpertWeights w = test::random_fp8_shared(rng, H, cfg.shared_inter(), test::TileScales::PowersOfTwo);
  DeviceSharedExpert shared(w, cfg, T);
  std::vector<uint16_t> x(size_t(T * H));
  for (auto& v : x) v = bf16_from_float(rng.normal()).bits;
  DeviceBuffer<uint16_t> dx(x.size() + 8);  // room for the copy one element in
  DeviceBuffer<float> aligned(size_t(T * H)), shifted(size_t(T * H));
  dx.upload(x.data(), x.size());
  shared.run(dx.get(), true, T, aligned.get(), nullptr);
  NVFP4_CUDA_CHECK(cudaMemcpy(dx.get() + 1, x.data(), x.size() * 2, cudaMemcpyHostToDevice));
  shared.run(dx.get() + 1, true, T, shifted.get(), nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> a(size_t(T * H)), b(size_t(T * H));
  aligned.download(a.data(), a.size());
  shifted.download(b.data(), b.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace nvfp4moe::cuda
