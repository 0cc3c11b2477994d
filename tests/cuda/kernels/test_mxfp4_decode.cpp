// The MXFP4 kernels (kernels/mxfp4_decode.hpp) and DeviceQuantizer's MXFP4
// entry points against the host functions they stand in for: the BF16
// decode bit for bit against dequantize_mxfp4_rows, the largest scale byte
// against mxfp4_kmax, requantization and the lossless cast byte for byte
// against requantize_mxfp4 / cast_mxfp4_lossless, on scale bytes over the
// whole finite range 0x00..0xfc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "checkpoint/convert_expert.hpp"
#include "checkpoint/mxfp4_weights.hpp"
#include "cuda/backend/device_quantizer.hpp"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels/mxfp4_decode.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using cuda::DeviceBuffer;

#define SKIP_WITHOUT_GPU() \
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device"

struct HostMx {
  int64_t rows, cols;
  std::vector<uint8_t> codes, scales;
  TensorInfo weight, scale;  // views of the bytes, as read_mxfp4_weight gives them
  Mxfp4WeightView view() const { return Mxfp4WeightView{&weight, &scale, rows, cols}; }
};

// Scale bytes in [lo, hi] (hi <= 0xfc); zero_blocks of them 0x00.
HostMx random_mx(test::Rng& rng, const std::string& name, int64_t rows, int64_t cols, int lo, int hi,
                 int zero_blocks = 0) {
  HostMx m{rows, cols, std::vector<uint8_t>(size_t(rows * cols / 2)), std::vector<uint8_t>(size_t(rows * cols / 32)),
           {}, {}};
  for (auto& b : m.codes) b = uint8_t(rng.next());
  for (auto& s : m.scales) s = uint8_t(lo + rng.below(hi - lo + 1));
  for (int i = 0; i < zero_blocks; ++i) m.scales[size_t(rng.below(int64_t(m.scales.size())))] = 0;
  m.weight = TensorInfo{name + ".weight", DType::U8, {rows, cols / 2}, m.codes.data(), m.codes.size()};
  m.scale = TensorInfo{name + ".scale", DType::F8E8M0, {rows, cols / 32}, m.scales.data(), m.scales.size()};
  return m;
}

void expect_same(const Nvfp4Tensor& got, const Nvfp4Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.g, want.g);
  EXPECT_EQ(got.blocks, want.blocks);
  EXPECT_EQ(got.exact_blocks, want.exact_blocks);
  ASSERT_EQ(got.codes.size(), want.codes.size());
  ASSERT_EQ(got.scales.size(), want.scales.size());
  EXPECT_EQ(test::first_mismatch(got.codes.data(), want.codes.data(), int64_t(want.codes.size())), -1) << "codes";
  EXPECT_EQ(test::first_mismatch(got.scales.data(), want.scales.data(), int64_t(want.scales.size())), -1)
      << "scales";
}

TEST(Mxfp4Decode, Bf16ValuesAndLargestScaleByteAsTheHost) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  for (const auto& [rows, cols, lo, hi] : {std::tuple{3, 32, 0, 0xfc}, std::tuple{257, 7168, 0, 0xfc},
                                          std::tuple{64, 3072, 100, 130}, std::tuple{5, 64, 0, 0}}) {
    SCOPED_TRACE("[" + std::to_string(rows) + ", " + std::to_string(cols) + "] bytes " + std::to_string(lo) + ".." +
                 std::to_string(hi));
    const HostMx m = random_mx(rng, "w", rows, cols, lo, hi);
    std::vector<Bf16> want(size_t(rows * cols));
    dequantize_mxfp4_rows(m.codes.data(), m.scales.data(), rows, cols, want.data());
    DeviceBuffer<uint8_t> c(m.codes.size()), s(m.scales.size());
    DeviceBuffer<uint16_t> out(want.size());
    DeviceBuffer<unsigned> top(1);
    c.upload(m.codes.data(), m.codes.size());
    s.upload(m.scales.data(), m.scales.size());
    cuda::mxfp4_decode_bf16(c.get(), s.get(), rows, cols, reinterpret_cast<__nv_bfloat16*>(out.get()), nullptr);
    cuda::mxfp4_max_scale_byte(s.get(), int64_t(m.scales.size()), top.get(), nullptr);
    std::vector<uint16_t> got(want.size());
    unsigned b = 0;
    out.download(got.data(), got.size());
    top.download(&b, 1);
    NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], want[i].bits) << "element " << i << " (row " << i / size_t(cols) << ", scale byte "
                                      << int(m.scales[i / 32]) << ")";
    EXPECT_EQ(b == 0 ? 0 : int(b) - 127, mxfp4_kmax(m.scales.data(), int64_t(m.scales.size())));
  }
}

TEST(Mxfp4Decode, DeviceQuantizerGivesTheHostConversion) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  cuda::DeviceQuantizer dq(0);
  dq.enable_timing();
  const HostMx w1 = random_mx(rng, "e.w1", 384, 1024, 110, 128, 30);
  const HostMx w3 = random_mx(rng, "e.w3", 384, 1024, 100, 135);
  const HostMx w2 = random_mx(rng, "e.w2", 1024, 384, 0, 0xfc, 10);  // every finite byte: most blocks requantized
  for (const HostMx* m : {&w1, &w3, &w2}) {
    const Mxfp4WeightView v = m->view();
    const std::string& n = m->weight.name;
    EXPECT_EQ(dq.amax(v), mxfp4_amax(m->codes.data(), m->scales.data(), m->rows, m->cols)) << n;
    EXPECT_EQ(dq.kmax(v), mxfp4_kmax(m->scales.data(), int64_t(m->scales.size()))) << n;
    const float g = global_scale_for_amax(dq.amax(v));
    expect_same(dq.requantize(v, g), requantize_mxfp4(m->codes.data(), m->scales.data(), m->rows, m->cols, g),
                n + " requantized");
    for (const int mm : {dq.kmax(v) - 8, dq.kmax(v) - 20})
      expect_same(dq.cast_lossless(v, mm), cast_mxfp4_lossless(m->codes.data(), m->scales.data(), m->rows, m->cols,
                                                               mm, 0),
                  n + " lossless, m " + std::to_string(mm));
  }
  // The cache: a weight asked for after another is uploaded again, not mistaken for it.
  const float a1 = mxfp4_amax(w1.codes.data(), w1.scales.data(), w1.rows, w1.cols);
  EXPECT_EQ(dq.amax(w1.view()), a1);
  const cuda::DeviceQuantizerTimes t = dq.times();
  EXPECT_GT(t.kernel_ms, 0.0);
  EXPECT_GT(t.upload_ms, 0.0);
  EXPECT_GE(t.uploads, 4);
}

}  // namespace
}  // namespace nvfp4moe
