// The bf16 and fp8 activation modes of the staging kernels (staging.hpp,
// docs/numerics.md §7): sm90_nvfp4_stage / sm90_nvfp4_requant against
// quantize_activations_ref / requantize_rows_ref bit for bit, and both
// against the CPU backend's stage_activation_rows, on random rows with NaN,
// Inf, huge, tiny, subnormal and signed-zero values, logical and k-slot
// order, short last 128-blocks, one-row and many-row launches.
#include <cuda_runtime.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "cpu/cpu_moe.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/ref/staging_ref.hpp"
#include "cuda/kernels/staging.hpp"
#include "cuda/layout/operand_order.hpp"
#include "nvfp4moe/types.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;

// Rows of mixed magnitude; rows 1.. carry the corners of §7.
std::vector<float> act_rows(Rng& rng, int64_t rows, int64_t cols) {
  std::vector<float> x(size_t(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = std::exp2(float(rng.below(60)) - 30.0f);
    for (int64_t c = 0; c < cols; ++c) x[size_t(r * cols + c)] = rng.normal() * scale;
  }
  auto at = [&](int64_t r, int64_t c) -> float& { return x[size_t(r * cols + c)]; };
  if (rows > 1) at(1, cols - 1) = std::nanf("");  // NaN in the last block
  if (rows > 2) at(2, 5) = -INFINITY;
  if (rows > 3)
    for (int64_t c = 0; c < cols; ++c) at(3, c) = (c % 2 ? -1.0f : 1.0f) * FLT_MAX * (float(c % 7 + 1) / 7.0f);  // up to FLT_MAX: BF16 overflow
  if (rows > 4)
    for (int64_t c = 0; c < cols; ++c) at(4, c) = c % 3 == 0 ? -0.0f : 1e-6f * rng.normal();  // amax under the 1e-4 floor
  if (rows > 5)
    for (int64_t c = 0; c < cols; ++c) at(5, c) = c % 2 ? 1e-39f : -3e-41f;  // subnormal floats
  if (rows > 6) {
    for (int64_t c = 0; c < cols; ++c) at(6, c) = 0.0f;  // an all-zero row
    at(6, 0) = 448.0f * 0x1p-30f;                        // one exact power-of-two block maximum
  }
  if (rows > 7)
    for (int64_t c = 0; c < cols; ++c) at(7, c) = rng.normal() * (c < 128 ? 1e4f : 1e-3f);  // blocks far apart
  return x;
}

struct Out {
  std::vector<float> g;
  std::vector<uint16_t> deq;
};

Out stage(bool fast, ActivationMode mode, const void* dx, bool bf16, int64_t rows, int64_t cols, int64_t ld,
          OperandOrder order) {
  DeviceBuffer<float> g{size_t(rows)};
  DeviceBuffer<__nv_bfloat16> deq{size_t(rows * ld)};
  NVFP4_CUDA_CHECK(cudaMemset(deq.get(), 0xFF, deq.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(g.get(), 0xFF, g.bytes()));
  QuantizeActArgs a{.x = dx, .x_is_bf16 = bf16, .rows = rows, .cols = cols, .g_out = g.get(), .deq = deq.get(),
                    .deq_ld = ld, .deq_order = order, .mode = mode};
  if (fast) {
    EXPECT_TRUE(sm90_nvfp4_stage_supports(a));
    sm90_nvfp4_stage(a, nullptr);
  } else {
    quantize_activations_ref(a, nullptr);
  }
  Out o{std::vector<float>(size_t(rows)), std::vector<uint16_t>(size_t(rows * ld))};
  g.download(o.g.data(), o.g.size());
  deq.download(reinterpret_cast<__nv_bfloat16*>(o.deq.data()), o.deq.size());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  return o;
}

// The CPU backend's values of these rows as the operand's BF16 bits, at the
// operand's columns (kslot: moved by operand_kslot_column), zero tail; NaN
// compared by NaN-ness only.
void expect_cpu_values(ActivationMode mode, const std::vector<float>& x, int64_t rows, int64_t cols, int64_t ld,
                       bool kslot, const Out& o) {
  std::vector<float> v(x.size()), g(static_cast<size_t>(rows));
  cpu::stage_activation_rows(mode, x.data(), rows, cols, nullptr, 0, v.data(), g.data());
  int64_t bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_EQ(o.g[size_t(r)], 1.0f) << "g of row " << r;
    for (int64_t c = 0; c < ld; ++c) {
      const int64_t col = c < cols && kslot ? operand_kslot_column(c) : c;
      const uint16_t got = o.deq[size_t(r * ld + col)];
      const float want = c < cols ? v[size_t(r * cols + c)] : 0.0f;
      const bool ok = std::isnan(want) ? ((got & 0x7fffu) > 0x7f80u) : got == bf16_from_float(want).bits;
      if (!ok && bad++ < 5)
        ADD_FAILURE() << "row " << r << " column " << c << ": operand 0x" << std::hex << got << ", CPU value "
                      << want << " (0x" << bf16_from_float(want).bits << ")" << std::dec;
    }
  }
  EXPECT_EQ(bad, 0) << "operand values differing from the CPU backend's";
}

struct Shape {
  bool bf16;
  int64_t rows, cols;
};

class StageActModes : public ::testing::TestWithParam<Shape> {};

TEST_P(StageActModes, FastEqualsReferenceAndTheCpuBitForBit) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const Shape sh = GetParam();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " bf16=" << sh.bf16 << " rows=" << sh.rows
                                    << " cols=" << sh.cols);
  Rng rng(seed);
  std::vector<float> x = act_rows(rng, sh.rows, sh.cols);
  std::vector<Bf16> xb(x.size());
  for (size_t i = 0; i < x.size(); ++i) xb[i] = bf16_from_float(x[i]);
  if (sh.bf16)
    for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(xb[i]);
  DeviceBuffer<uint8_t> dx(x.size() * 4);
  NVFP4_CUDA_CHECK(cudaMemcpy(dx.get(), sh.bf16 ? static_cast<const void*>(xb.data()) : x.data(),
                              x.size() * (sh.bf16 ? 2 : 4), cudaMemcpyHostToDevice));
  const int64_t ld = (sh.cols + 63) / 64 * 64 + 64;
  for (ActivationMode mode : {ActivationMode::Bf16, ActivationMode::Fp8})
    for (bool kslot : {false, true}) {
      if (kslot && sh.cols % 64) continue;
      SCOPED_TRACE(::testing::Message() << activation_mode_name(mode) << (kslot ? " k-slot" : " logical"));
      const OperandOrder order = kslot ? OperandOrder{nullptr, -1} : OperandOrder{};
      const Out fast = stage(true, mode, dx.get(), sh.bf16, sh.rows, sh.cols, ld, order);
      const Out ref = stage(false, mode, dx.get(), sh.bf16, sh.rows, sh.cols, ld, order);
      EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(fast.deq.data()),
                      reinterpret_cast<const uint8_t*>(ref.deq.data()), int64_t(fast.deq.size() * 2),
                      "operand, sm90_nvfp4_stage vs quantize_activations_ref");
      EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(fast.g.data()), reinterpret_cast<const uint8_t*>(ref.g.data()),
                      int64_t(fast.g.size() * 4), "g");
      expect_cpu_values(mode, x, sh.rows, sh.cols, ld, kslot, ref);
      if (mode == ActivationMode::Fp8 && sh.rows > 1) {  // a NaN reaches its 128-block only
        const int64_t c = (sh.cols - 1) / 128 * 128;      // first column of the last block
        const int64_t col = kslot ? operand_kslot_column(c) : c;
        EXPECT_GT(fast.deq[size_t(ld + col)] & 0x7fffu, 0x7f80u) << "the NaN's block";
        if (c > 0) EXPECT_LE(fast.deq[size_t(ld)] & 0x7fffu, 0x7f80u) << "another block of the NaN's row";
      }
    }
}

// 1 and 37 rows: one thread per 16-block; 300: 128-thread CTAs, several rows
// each. 48 and 1088 columns: a last 128-block of 48 and of 64 columns.
INSTANTIATE_TEST_SUITE_P(Shapes, StageActModes,
                         ::testing::Values(Shape{true, 1, 7168}, Shape{false, 37, 7168}, Shape{true, 300, 3072},
                                           Shape{false, 300, 2048}, Shape{true, 12, 48}, Shape{false, 9, 1088}));

// The L2 input: h rows (FP32) of which *num_rows are live; the dead rows stay untouched.
TEST(StageActModes, RequantizedRowsMatchTheReferenceAndTheCpu) {
  if (!test::gpu_available()) GTEST_SKIP() << "no CUDA device";
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Rng rng(seed);
  for (const int64_t cols : {int64_t(3072), int64_t(2048), int64_t(192)}) {
    const int64_t rows_max = 400, live = 333, ld = cols + 64;
    std::vector<float> h = act_rows(rng, rows_max, cols);
    DeviceBuffer<float> dh(h.size());
    dh.upload(h.data(), h.size());
    DeviceBuffer<int32_t> dn(1);
    const int32_t n32 = int32_t(live);
    dn.upload(&n32, 1);
    for (ActivationMode mode : {ActivationMode::Bf16, ActivationMode::Fp8})
      for (bool kslot : {false, true}) {
        SCOPED_TRACE(::testing::Message() << "cols " << cols << " " << activation_mode_name(mode)
                                          << (kslot ? " k-slot" : " logical"));
        Out out[2];
        for (int fast = 0; fast < 2; ++fast) {
          DeviceBuffer<float> g{size_t(rows_max)};
          DeviceBuffer<__nv_bfloat16> deq{size_t(rows_max * ld)};
          NVFP4_CUDA_CHECK(cudaMemset(deq.get(), 0xFF, deq.bytes()));
          NVFP4_CUDA_CHECK(cudaMemset(g.get(), 0xFF, g.bytes()));
          RequantRowsArgs a{.h = dh.get(), .ld_h = cols, .cols = cols, .rows_max = rows_max, .num_rows = dn.get(),
                            .g_out = g.get(), .deq = deq.get(), .deq_ld = ld,
                            .deq_order = kslot ? OperandOrder{nullptr, -1} : OperandOrder{}, .mode = mode};
          if (fast) {
            EXPECT_TRUE(sm90_nvfp4_requant_supports(a));
            sm90_nvfp4_requant(a, nullptr);
          } else {
            requantize_rows_ref(a, nullptr);
          }
          out[fast] = Out{std::vector<float>(size_t(rows_max)), std::vector<uint16_t>(size_t(rows_max * ld))};
          g.download(out[fast].g.data(), out[fast].g.size());
          deq.download(reinterpret_cast<__nv_bfloat16*>(out[fast].deq.data()), out[fast].deq.size());
          NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
        }
        EXPECT_BYTES_EQ(reinterpret_cast<const uint8_t*>(out[1].deq.data()),
                        reinterpret_cast<const uint8_t*>(out[0].deq.data()), int64_t(out[0].deq.size() * 2),
                        "operand, sm90_nvfp4_requant vs requantize_rows_ref");
        for (int64_t i = live * ld; i < rows_max * ld; ++i)
          ASSERT_EQ(out[1].deq[size_t(i)], 0xFFFF) << "dead row " << i / ld << " was written";
        Out live_part{std::vector<float>(out[1].g.begin(), out[1].g.begin() + live),
                      std::vector<uint16_t>(out[1].deq.begin(), out[1].deq.begin() + live * ld)};
        expect_cpu_values(mode, std::vector<float>(h.begin(), h.begin() + live * cols), live, cols, ld, kslot,
                          live_part);
      }
  }
}

TEST(StageActModes, RefuseNvfp4BytesInTheOtherModes) {
  QuantizeActArgs a{.rows = 1, .cols = 64, .mode = ActivationMode::Fp8};
  uint8_t* fake = reinterpret_cast<uint8_t*>(uintptr_t(256));
  a.g_out = reinterpret_cast<float*>(fake);
  a.codes = fake;
  EXPECT_ERROR_CONTAINS(quantize_activations_ref(a, nullptr), "activation mode fp8", "BF16 operand only");
}

}  // namespace
}  // namespace nvfp4moe::cuda
