// DeviceQuantizer's groups in flight (quantize's pipeline): the amaxes and
// the codes and block scales of every tensor of every group against the
// host's (byte for byte), with two slots used alternately, a slot staged
// while the other's results are still unread, groups that grow the
// buffers, F32 and BF16 inputs; one upload per group, and a NaN refused
// naming its tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/backend/device_quantizer.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

struct HostTensor {
  std::string name;
  int64_t rows, cols;
  bool bf16;
  std::vector<Bf16> b;
  std::vector<float> f;
  float amax() const {
    float m = 0;
    if (bf16)
      for (Bf16 x : b) m = std::max(m, std::fabs(bf16_to_float(x)));
    else
      for (float x : f) m = std::max(m, std::fabs(x));
    return m;
  }
  Nvfp4Matrix quantized(float g) const {
    return bf16 ? quantize_matrix(b.data(), rows, cols, ScaleScope::Static, g)
                : quantize_matrix(f.data(), rows, cols, ScaleScope::Static, g);
  }
};

HostTensor random_tensor(test::Rng& rng, const std::string& name, int64_t rows, int64_t cols, bool bf16, float s) {
  HostTensor t{name, rows, cols, bf16, {}, {}};
  for (float x : test::random_normal(rng, rows * cols, s)) {
    if (bf16) t.b.push_back(bf16_from_float(x));
    else t.f.push_back(x);
  }
  return t;
}

void stage(cuda::DeviceQuantizer& dq, int slot, const std::vector<const HostTensor*>& g) {
  std::vector<cuda::DeviceQuantizer::GroupTensor> spec;
  for (const HostTensor* t : g) spec.push_back({t->name, t->rows, t->cols, t->bf16});
  const std::vector<uint8_t*> at = dq.stage_group(slot, spec);
  ASSERT_EQ(at.size(), g.size());
  for (size_t j = 0; j < g.size(); ++j) {
    if (g[j]->bf16) std::memcpy(at[j], g[j]->b.data(), g[j]->b.size() * 2);
    else std::memcpy(at[j], g[j]->f.data(), g[j]->f.size() * 4);
  }
}

TEST(DeviceQuantizerGroups, EveryGroupGivesTheHostsBytes) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  const std::vector<HostTensor> ts = {
      random_tensor(rng, "e0.w1", 96, 256, true, 1.0f),  random_tensor(rng, "e0.w3", 96, 256, true, 4.0f),
      random_tensor(rng, "e0.w2", 256, 96, true, 0.5f),  random_tensor(rng, "f32", 130, 48, false, 2.0f),
      random_tensor(rng, "e1.w1", 300, 512, true, 0.1f), random_tensor(rng, "e1.w3", 300, 512, true, 0.2f),
      random_tensor(rng, "empty", 0, 32, true, 1.0f)};
  const std::vector<std::vector<const HostTensor*>> groups = {
      {&ts[0], &ts[1]}, {&ts[2]}, {&ts[3]}, {&ts[4], &ts[5]}, {&ts[6]}};
  cuda::DeviceQuantizer dq(0);
  dq.enable_timing();
  dq.set_slots(2);
  uint64_t in_bytes = 0;
  stage(dq, 0, groups[0]);
  for (size_t i = 0; i < groups.size(); ++i) {
    const int slot = int(i % 2);
    SCOPED_TRACE("group " + std::to_string(i) + " (" + groups[i][0]->name + ")");
    const std::vector<float> a = dq.group_amaxes(slot);
    ASSERT_EQ(a.size(), groups[i].size());
    float m = 0;
    for (size_t j = 0; j < a.size(); ++j) {
      EXPECT_EQ(a[j], groups[i][j]->amax()) << groups[i][j]->name;
      m = std::max(m, a[j]);
    }
    const float g = global_scale_for_amax(m);
    dq.quantize_group(slot, g);
    if (i + 1 < groups.size()) stage(dq, int((i + 1) % 2), groups[i + 1]);  // before this group's results are read
    for (size_t j = 0; j < groups[i].size(); ++j) {
      const HostTensor& t = *groups[i][j];
      const Nvfp4Matrix want = t.quantized(g);
      const cuda::DeviceQuantizer::GroupResult r = dq.group_result(slot, j);
      const int64_t nc = int64_t(want.codes.size()), ns = int64_t(want.scales.size());
      EXPECT_EQ(test::first_mismatch(r.codes, want.codes.data(), nc), -1) << t.name << " codes";
      EXPECT_EQ(test::first_mismatch(r.scales, want.scales.data(), ns), -1) << t.name << " scales";
      in_bytes += uint64_t(t.rows * t.cols) * (t.bf16 ? 2 : 4);
    }
  }
  const cuda::DeviceQuantizerTimes times = dq.times();
  EXPECT_EQ(times.uploads, int64_t(ts.size())) << "each tensor uploaded once";
  EXPECT_GE(times.upload_bytes, in_bytes);
  EXPECT_LT(times.upload_bytes, in_bytes + ts.size() * 256) << "its bytes and the alignment padding only";
  EXPECT_GT(times.upload_ms, 0.0);
  EXPECT_GT(times.kernel_ms, 0.0);
  EXPECT_GT(times.download_ms, 0.0);
}

TEST(DeviceQuantizerGroups, NanIsRefusedNamingTheTensor) {
  SKIP_WITHOUT_GPU();
  test::Rng rng(test::fresh_seed());
  HostTensor a = random_tensor(rng, "e0.w1", 64, 128, true, 1.0f), b = random_tensor(rng, "e0.w3", 64, 128, true, 1.0f);
  b.b[777] = Bf16{0x7fc0};
  cuda::DeviceQuantizer dq(0);
  dq.set_slots(1);
  stage(dq, 0, {&a, &b});
  test::expect_error([&] { dq.group_amaxes(0); }, {"tensor \"e0.w3\"", "NaN"}, "group_amaxes");
}

}  // namespace
}  // namespace nvfp4moe
