// fp8_operand_rows against fp8_operand_rows_ref, bit for bit: act_quant
// blocks of every spread, all-zero blocks, a NaN, a device count of live rows
// (rows past it untouched), and the device-side choice that skips the work.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/fp8_operand.hpp"
#include "cuda/layout/fp8_operand.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/fp8_act_rows.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

TEST(Fp8OperandRows, MatchesTheReferenceBitForBit) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed=" << seed);
  Rng rng(seed);
  const int64_t rows = 300, cols = 1024, ld = 1088, live = 211;
  std::vector<uint16_t> in = test::act_quant_rows(rng, rows, cols, ld);
  in[size_t(17 * ld + 600)] = 0xFFC1;  // a NaN: block 4 of row 17
  std::vector<uint8_t> want(size_t(rows * ld), 0x5A);
  std::vector<float> want_s(size_t(rows * cols / 128), -1.0f);
  fp8_operand_rows_ref(in.data(), live, cols, ld, want.data(), ld, want_s.data());

  DeviceBuffer<uint16_t> d_in(in.size());
  d_in.upload(in.data(), in.size());
  DeviceBuffer<uint8_t> d_codes(want.size());
  DeviceBuffer<float> d_scales(want_s.size());
  DeviceBuffer<int32_t> d_live(1);
  const int32_t live32 = int32_t(live);
  d_live.upload(&live32, 1);
  NVFP4_CUDA_CHECK(cudaMemset(d_codes.get(), 0x5A, d_codes.bytes()));
  std::vector<float> minus(want_s.size(), -1.0f);
  d_scales.upload(minus.data(), minus.size());
  Fp8OperandArgs a{.in = reinterpret_cast<const __nv_bfloat16*>(d_in.get()), .ld_in = ld, .rows_max = rows,
                   .live_rows = d_live.get(), .cols = cols, .codes = d_codes.get(), .ld_codes = ld,
                   .scales = d_scales.get()};
  fp8_operand_rows(a, nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> got(want.size());
  std::vector<float> got_s(want_s.size());
  d_codes.download(got.data(), got.size());
  d_scales.download(got_s.data(), got_s.size());
  for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << "byte " << i << " (row " << i / ld << ")";
  for (size_t i = 0; i < want_s.size(); ++i)
    ASSERT_EQ(std::memcmp(&got_s[i], &want_s[i], 4), 0) << "scale " << i << ": " << got_s[i] << " vs " << want_s[i];
  EXPECT_TRUE(std::isnan(got_s[17 * 8 + 4]));
  EXPECT_EQ(got_s[size_t(live * 8)], -1.0f) << "a row past the live count was written";

  // The device-side choice: with the live pair count at or below pairs_above nothing is written.
  NVFP4_CUDA_CHECK(cudaMemset(d_codes.get(), 0x5A, d_codes.bytes()));
  a.live_pairs = d_live.get();
  a.pairs_above = live32;
  fp8_operand_rows(a, nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  d_codes.download(got.data(), got.size());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], 0x5A) << "byte " << i << " written while skipped";
}

TEST(Fp8OperandRows, RejectsBadShapesNamingThem) {
  Fp8OperandArgs a;
  uint8_t dummy[64];
  a.in = reinterpret_cast<const __nv_bfloat16*>(dummy);
  a.codes = dummy;
  a.scales = reinterpret_cast<float*>(dummy);
  a.cols = 200;
  a.ld_in = 256;
  a.ld_codes = 256;
  EXPECT_ERROR_CONTAINS(fp8_operand_rows(a, nullptr), "200 columns", "multiple of 128");
}

}  // namespace
}  // namespace nvfp4moe::cuda
