// The FP8 shared expert on its FP8 bytes (shared_expert_fp8): the E4M3 ->
// BF16 register conversion bit for bit on every byte pair; one-hot tokens,
// whose gate and up are single weights, so every converted weight shows in h;
// random inputs against an FP64 evaluation from the same BF16 x and the
// kernel's own h, at every token-tile width, forced and chosen K splits of
// the split form and shapes that are not multiples of the 128-column tile;
// outputs poisoned first; two runs bit-identical (split sums and the wgmma
// form's two warpgroups' sums are added in a fixed order).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/cuda_check.hpp"
#include "cuda/kernels/fp8_dequant.cuh"
#include "cuda/kernels/shared_expert_fp8.hpp"
#include "cuda/layout/fp8_fragment_layout.hpp"
#include "format/nvfp4_codec.hpp"
#include "nvfp4moe/moe.hpp"
#include "nvfp4moe/types.hpp"
#include "support/shared_fp8_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cuda {
namespace {

using test::Rng;
using test::TileScales;

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

// out[0]: the FP16-based pair conversion; out[1], out[2]: the integer one of
// four bytes, with the pair in bytes 0-1 (and the other pair 0x38 0xb8,
// +-1.0), then in bytes 2-3 (the other pair the same pair, swapped).
__global__ void convert_pairs_kernel(uint32_t* out) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 65536u) return;
  out[i] = e4m3x2_to_bf16x2(uint16_t(i));
  uint32_t b01, b23, c01, c23;
  e4m3x4_to_bf16x2(i | 0xb8380000u, b01, b23);
  e4m3x4_to_bf16x2((i << 16) | (i >> 8) | ((i & 0xffu) << 8), c01, c23);
  out[65536u + i] = b01;
  out[2u * 65536u + i] = c23;
  if (b23 != 0xbf803f80u) out[65536u + i] = 0xdeadbeefu;  // the other pair: -1.0 (high), 1.0 (low)
  if (c01 != ((out[i] >> 16) | (out[i] << 16))) out[2u * 65536u + i] = 0xdeadbeefu;
}

TEST(SharedFp8, E4m3PairsToBf16BitExact) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<uint32_t> d(3 * 65536);
  convert_pairs_kernel<<<256, 256>>>(d.get());
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> got(3 * 65536);
  d.download(got.data(), got.size());
  int checked = 0;
  for (uint32_t i = 0; i < 65536u; ++i) {
    const uint8_t lo = uint8_t(i), hi = uint8_t(i >> 8);
    if ((lo & 0x7F) == 0x7F || (hi & 0x7F) == 0x7F) continue;  // NaN: refused when weights load
    const uint32_t want = uint32_t(bf16_from_float(fmt::e4m3_value(lo)).bits) |
                          (uint32_t(bf16_from_float(fmt::e4m3_value(hi)).bits) << 16);
    for (int form = 0; form < 3; ++form)
      ASSERT_EQ(got[size_t(form) * 65536u + i], want) << "form " << form << " bytes 0x" << std::hex << int(lo) << " 0x" << int(hi);
    ++checked;
  }
  EXPECT_EQ(checked, 254 * 254);
}

struct Fp8Case {
  int64_t tokens, hidden, inter;
  int splits;  // 0: chosen by the kernel
  bool limit;
  Fp8SharedPath path = Fp8SharedPath::Auto;
  int gemv_stages = 0;  // the GEMV form's register stages, 0: chosen by the launcher
  int gemv_warps = 0;   // the GEMV form's warps a CTA, 0: chosen by the launcher
};

std::string case_name(const Fp8Case& c, uint64_t seed) {
  return "seed=" + std::to_string(seed) + " T=" + std::to_string(c.tokens) + " H=" + std::to_string(c.hidden) +
         " Is=" + std::to_string(c.inter) + " splits=" + std::to_string(c.splits) +
         " path=" + std::to_string(int(c.path)) + " gemv_stages=" + std::to_string(c.gemv_stages) +
         " gemv_warps=" + std::to_string(c.gemv_warps);
}

struct Fp8Result {
  std::vector<uint16_t> h;  // [T, Is] BF16 bits
  std::vector<float> out;   // [T, H]
};

// One forward on the device, h and out poisoned with NaN first.
Fp8Result run_fp8(const Fp8Case& c, const std::vector<uint16_t>& xb, const SharedExpertWeights& w) {
  const int64_t T = c.tokens, H = c.hidden, Is = c.inter;
  std::vector<uint8_t> w13 = w.w1_fp8;
  w13.insert(w13.end(), w.w3_fp8.begin(), w.w3_fp8.end());
  w13 = fp8_fragments(w13, {.rows = 2 * Is, .cols = H, .pairs = true});
  const std::vector<uint8_t> w2 = fp8_fragments(w.w2_fp8, {.rows = H, .cols = Is, .pairs = false});
  std::vector<float> s13 = fp8_group_scales(w.w1_scale, Is, H);
  const std::vector<float> s3 = fp8_group_scales(w.w3_scale, Is, H), s2 = fp8_group_scales(w.w2_scale, H, Is);
  s13.insert(s13.end(), s3.begin(), s3.end());
  DeviceBuffer<uint16_t> dx(xb.size()), dh(size_t(T * Is));
  DeviceBuffer<uint8_t> dw13(w13.size()), dw2(w2.size());
  DeviceBuffer<float> ds13(s13.size()), ds2(s2.size()), dout(size_t(T * H));
  DeviceBuffer<float> partial(size_t(kFp8MaxSplitRows) * 64 * size_t(std::max(2 * Is, H)));
  DeviceBuffer<int32_t> counters(size_t(shared_fp8_counters(H, Is)));
  DeviceBuffer<uint16_t> x_perm(xb.size());
  dx.upload(xb.data(), xb.size());
  dw13.upload(w13.data(), w13.size());
  dw2.upload(w2.data(), w2.size());
  ds13.upload(s13.data(), s13.size());
  ds2.upload(s2.data(), s2.size());
  NVFP4_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
  NVFP4_CUDA_CHECK(cudaMemset(dh.get(), 0xFF, dh.bytes()));      // BF16 NaN
  NVFP4_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, dout.bytes()));  // FP32 NaN
  SharedFp8Args a;
  a.x = reinterpret_cast<const __nv_bfloat16*>(dx.get());
  a.tokens = T;
  a.hidden = H;
  a.inter = Is;
  a.w13 = dw13.get();
  a.w13_scale = ds13.get();
  a.w2 = dw2.get();
  a.w2_scale = ds2.get();
  a.has_limit = c.limit;
  a.limit = 10.0f;
  a.h = reinterpret_cast<__nv_bfloat16*>(dh.get());
  a.out = dout.get();
  a.partial = partial.get();
  a.counters = counters.get();
  a.sms = sm_count();
  a.force_splits = c.splits;
  a.force_gemv_stages = c.gemv_stages;
  a.force_gemv_warps = c.gemv_warps;
  a.path = c.path;
  a.scales_fold = fp8_scales_are_powers_of_two(w.w1_scale, 7) && fp8_scales_are_powers_of_two(w.w3_scale, 7) &&
                  fp8_scales_are_powers_of_two(w.w2_scale, 7);
  a.x_perm = reinterpret_cast<__nv_bfloat16*>(x_perm.get());
  std::unique_ptr<Fp8WgmmaMaps> maps;
  if (H % 64 == 0 && Is % 64 == 0) {
    maps = std::make_unique<Fp8WgmmaMaps>(make_fp8_wgmma_maps(a.x_perm, a.h, T, H, Is));
    a.wgmma_maps = maps.get();
  }
  const bool wgmma = shared_fp8_uses_wgmma(a);
  shared_expert_fp8(a, nullptr);
  NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
  Fp8Result r{std::vector<uint16_t>(size_t(T * Is)), std::vector<float>(size_t(T * H))};
  dh.download(r.h.data(), r.h.size());
  if (wgmma) {  // the wgmma form leaves h in its column order: column 64c + p holds 64c + l
    const std::vector<uint16_t> h = r.h;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < Is; ++i) {
        const int64_t l = i % 64, q = l % 4, tq = l / 16, st = (l % 16) / 4;
        const int64_t p = 16 * st + (q < 2 ? 2 * tq + q : 8 + 2 * tq + q - 2);
        r.h[size_t(t * Is + i)] = h[size_t(t * Is + i - l + p)];
      }
  }
  dout.download(r.out.data(), r.out.size());
  // The counters are back at zero for the next call.
  std::vector<int32_t> left(counters.size());
  counters.download(left.data(), left.size());
  for (int32_t v : left) EXPECT_EQ(v, 0);
  return r;
}

// Weight (row, k) of a [rows, cols] FP8 projection as the checkpoint defines it.
double weight_value(const std::vector<uint8_t>& q, const std::vector<float>& scale, int64_t cols, int64_t row,
                    int64_t k) {
  const int64_t tiles_k = (cols + 127) / 128;
  return double(fmt::e4m3_value(q[size_t(row * cols + k)])) * scale[size_t((row / 128) * tiles_k + k / 128)];
}

float swiglu_host(float gate, float up, bool limit) {
  if (limit) {
    gate = std::min(gate, 10.0f);
    up = std::max(-10.0f, std::min(up, 10.0f));
  }
  return gate / (1.0f + std::exp(-gate)) * up;
}

struct ReferenceH {
  std::vector<float> h;    // [T, Is] before the BF16 rounding
  std::vector<float> tol;  // what FP32 sums of another order may move it by
};

// h as the contract defines it from BF16 x: FP64 sums, then swiglu in FP32.
// Its tolerance: two BF16 steps (the kernel rounds h once and a value next
// to a rounding boundary may go the other way), plus what an FP32 error of
// 1e-5 x sum |x w| in gate and up moves swiglu by (|d silu| <= 1.1).
ReferenceH reference_h(const Fp8Case& c, const std::vector<uint16_t>& xb, const SharedExpertWeights& w) {
  const int64_t H = c.hidden, Is = c.inter;
  ReferenceH r{std::vector<float>(size_t(c.tokens * Is)), std::vector<float>(size_t(c.tokens * Is))};
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t i = 0; i < Is; ++i) {
      double gate = 0.0, up = 0.0, gate_mag = 0.0, up_mag = 0.0;
      for (int64_t k = 0; k < H; ++k) {
        const double x = double(bf16_to_float(Bf16{xb[size_t(t * H + k)]}));
        const double pg = x * weight_value(w.w1_fp8, w.w1_scale, H, i, k), pu = x * weight_value(w.w3_fp8, w.w3_scale, H, i, k);
        gate += pg;
        up += pu;
        gate_mag += std::fabs(pg);
        up_mag += std::fabs(pu);
      }
      const float h = swiglu_host(float(gate), float(up), c.limit);
      const double silu = std::fabs(gate / (1.0 + std::exp(-gate)));
      r.h[size_t(t * Is + i)] = h;
      r.tol[size_t(t * Is + i)] =
          float(std::fabs(h) * (2.0 / 128.0) + 1e-5 * (1.1 * gate_mag * std::fabs(up) + silu * up_mag) + 1e-30);
    }
  return r;
}

// The kernel's h against the reference, then out against FP64 sums over the
// kernel's own h, within FP32 summation error.
void check_result(const Fp8Case& c, const std::vector<uint16_t>& xb, const SharedExpertWeights& w,
                  const Fp8Result& r) {
  const int64_t H = c.hidden, Is = c.inter;
  const ReferenceH ref = reference_h(c, xb, w);
  for (size_t i = 0; i < ref.h.size(); ++i) {
    const float got = bf16_to_float(Bf16{r.h[i]});
    ASSERT_TRUE(std::isfinite(got)) << "h[" << i << "] not written";
    ASSERT_NEAR(got, ref.h[i], ref.tol[i]) << "h[" << i << "]";
  }
  for (int64_t t = 0; t < c.tokens; ++t)
    for (int64_t n = 0; n < H; ++n) {
      double sum = 0.0, mag = 0.0;
      for (int64_t i = 0; i < Is; ++i) {
        const double p = double(bf16_to_float(Bf16{r.h[size_t(t * Is + i)]})) * weight_value(w.w2_fp8, w.w2_scale, Is, n, i);
        sum += p;
        mag += std::fabs(p);
      }
      const float got = r.out[size_t(t * H + n)];
      ASSERT_TRUE(std::isfinite(got)) << "out[" << t << ", " << n << "] not written";
      ASSERT_NEAR(got, sum, 1e-5 * mag + 1e-30) << "out[" << t << ", " << n << "]";
    }
}

std::vector<uint16_t> random_bf16(Rng& rng, int64_t n) {
  std::vector<uint16_t> b(static_cast<size_t>(n));
  for (auto& v : b) v = bf16_from_float(rng.normal()).bits;
  return b;
}

// Token t is the unit vector at column k_t: its gate and up are the single
// weights W1[i, k_t], W3[i, k_t] (exact sums), so h shows every weight of
// those columns as converted, subnormal E4M3 values included.
TEST(SharedFp8, OneHotTokensShowEveryWeight) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  Rng rng(seed);
  for (const Fp8Case& c : {Fp8Case{64, 272, 208, 0, false}, Fp8Case{16, 272, 208, 0, false, Fp8SharedPath::Gemv}}) {
    SCOPED_TRACE(case_name(c, seed));
    const SharedExpertWeights w = test::random_fp8_shared(rng, c.hidden, c.inter, TileScales::PowersOfTwo);
    std::vector<uint16_t> xb(size_t(c.tokens * c.hidden), 0);
    for (int64_t t = 0; t < c.tokens; ++t) xb[size_t(t * c.hidden + (t * 37) % c.hidden)] = bf16_from_float(1.0f).bits;
    const Fp8Result r = run_fp8(c, xb, w);
    const std::vector<float> h_ref = reference_h(c, xb, w).h;
    for (size_t i = 0; i < h_ref.size(); ++i)  // one BF16 step: the device's expf may differ in an FP32 ulp
      ASSERT_NEAR(bf16_to_float(Bf16{r.h[i]}), h_ref[i], std::fabs(h_ref[i]) / 128.0f) << "h[" << i << "]";
    check_result(c, xb, w, r);
  }
}

// Arguments for the forms' host-side choices: aligned stand-in pointers
// (never dereferenced), power-of-two factors, maps for 64 tokens.
SharedFp8Args host_choice_args(Fp8WgmmaMaps& maps) {
  alignas(16) static uint8_t buffer[64];
  maps.max_tokens = 64;
  SharedFp8Args a;
  a.x = a.h = a.x_perm = reinterpret_cast<__nv_bfloat16*>(buffer);
  a.w13 = a.w2 = buffer;
  a.scales_fold = true;
  a.wgmma_maps = &maps;
  return a;
}

// The wgmma form keeps a CTA's tile factors in shared memory for K up to
// 16384 (128 K tiles): one projection's K beyond it sends the layer to the
// other forms, and forcing the wgmma form names the limit. Host logic only.
TEST(SharedFp8, WgmmaFormTakesKUpTo16384) {
  Fp8WgmmaMaps maps;
  SharedFp8Args a = host_choice_args(maps);
  a.tokens = 32;
  a.path = Fp8SharedPath::Wgmma;
  a.hidden = 16384;
  a.inter = 16384;
  EXPECT_TRUE(shared_fp8_wgmma_supports(a));
  a.hidden = 16384 + 64;
  EXPECT_FALSE(shared_fp8_wgmma_supports(a));
  EXPECT_ERROR_CONTAINS(shared_expert_fp8_wgmma(a, nullptr), "H=16448", "up to 16384");
  a.hidden = 7168;
  a.inter = 16384 + 64;
  EXPECT_FALSE(shared_fp8_wgmma_supports(a));
  a.inter = 3072;
  EXPECT_TRUE(shared_fp8_wgmma_supports(a));
}

// The GEMV form's register stages may be forced to 2 or 3 and its warps a
// CTA to 3 or 4 (tests), nothing else, and forcing the form takes at most
// 16 tokens; the checks come before any CUDA call. Host logic only.
TEST(SharedFp8, GemvShapeIsChecked) {
  Fp8WgmmaMaps maps;
  SharedFp8Args a = host_choice_args(maps);
  a.tokens = 4;
  a.hidden = 256;
  a.inter = 128;
  a.path = Fp8SharedPath::Gemv;
  for (const int stages : {1, 4, -1}) {
    a.force_gemv_stages = stages;
    EXPECT_ERROR_CONTAINS(shared_expert_fp8(a, nullptr), "2 or 3 register stages, not " + std::to_string(stages));
    EXPECT_ERROR_CONTAINS(shared_fp8_gemv_shape(a, true), "2 or 3 register stages, not " + std::to_string(stages));
  }
  a.force_gemv_stages = 0;
  for (const int warps : {2, 5, 8, -3}) {
    a.force_gemv_warps = warps;
    EXPECT_ERROR_CONTAINS(shared_expert_fp8(a, nullptr), "3 or 4 warps a CTA, not " + std::to_string(warps));
  }
  a.force_gemv_warps = 0;
  a.tokens = 17;  // the GEMV form's tokens end at 16
  EXPECT_ERROR_CONTAINS(shared_expert_fp8(a, nullptr), "up to 16 tokens, not 17");
  EXPECT_ERROR_CONTAINS(shared_fp8_gemv_shape(a, false), "up to 16 tokens, not 17");
}

// `a`'s down launch has the unforced GEMV shape `base`: forcing the other
// warp count keeps base's stages, forcing the other stage count its warps.
void expect_a_forced_field_overrides_its_part(SharedFp8Args a, Fp8GemvShape base) {
  const int warps = base.warps == 4 ? 3 : 4, stages = base.stages == 3 ? 2 : 3;
  a.force_gemv_warps = warps;
  EXPECT_EQ(shared_fp8_gemv_shape(a, false).warps, warps);
  EXPECT_EQ(shared_fp8_gemv_shape(a, false).stages, base.stages);
  a.force_gemv_warps = 0;
  a.force_gemv_stages = stages;
  EXPECT_EQ(shared_fp8_gemv_shape(a, false).warps, base.warps);
  EXPECT_EQ(shared_fp8_gemv_shape(a, false).stages, stages);
}

// The GEMV form's CTA shape on a 132-SM Hopper (H100 SXM, H200): three
// stages where the grid fits in one wave with them, else two; three-warp
// CTAs only for V4-Pro's 448 down m-tiles at two n8 tiles, which four-warp
// CTAs (3 an SM) do not fit. A forced field overrides its part only.
TEST(SharedFp8, GemvShapeFitsTheGridInOneWave) {
  SKIP_WITHOUT_GPU();
  if (sm_count() != 132) GTEST_SKIP() << "the expected shapes are those of 132 SMs, this GPU has " << sm_count();
  Fp8WgmmaMaps maps;
  SharedFp8Args a = host_choice_args(maps);
  struct Expect {
    int64_t hidden, inter, tokens;
    bool gate_up;
    int warps, stages;
  };
  for (const Expect& e : std::vector<Expect>{{7168, 3072, 1, true, 4, 3},  {7168, 3072, 1, false, 4, 2},
                                             {7168, 3072, 8, false, 4, 2}, {7168, 3072, 9, true, 4, 2},
                                             {7168, 3072, 12, false, 3, 2}, {7168, 3072, 16, false, 3, 2},
                                             {4096, 2048, 1, true, 4, 3},  {4096, 2048, 1, false, 4, 3},
                                             {4096, 2048, 16, true, 4, 3}, {4096, 2048, 16, false, 4, 3}}) {
    a.hidden = e.hidden;
    a.inter = e.inter;
    a.tokens = e.tokens;
    const Fp8GemvShape s = shared_fp8_gemv_shape(a, e.gate_up);
    EXPECT_EQ(s.warps, e.warps) << "H=" << e.hidden << " T=" << e.tokens << " gate_up=" << e.gate_up;
    EXPECT_EQ(s.stages, e.stages) << "H=" << e.hidden << " T=" << e.tokens << " gate_up=" << e.gate_up;
  }
  a.hidden = 7168;
  a.inter = 3072;
  a.tokens = 16;
  expect_a_forced_field_overrides_its_part(a, {.warps = 3, .stages = 2});
}

// A layer's table of GEMV shapes decides each launch's shape without asking
// the device: entry [gate_up][n8 tiles - 1], then the forced fields. The
// table here holds shapes no device rule gives together, so each entry is
// seen to be the one read. Host logic only.
TEST(SharedFp8, GemvShapeComesFromTheLayersTable) {
  Fp8WgmmaMaps maps;
  SharedFp8Args a = host_choice_args(maps);
  a.hidden = 7168;
  a.inter = 3072;
  Fp8GemvShapes table;
  table.of[0][0] = {.warps = 3, .stages = 3};
  table.of[0][1] = {.warps = 4, .stages = 3};
  table.of[1][0] = {.warps = 3, .stages = 2};
  table.of[1][1] = {.warps = 4, .stages = 2};
  a.gemv_shapes = &table;
  for (const int tokens : {1, 8, 9, 16})
    for (const bool gate_up : {false, true}) {
      a.tokens = tokens;
      const Fp8GemvShape want = table.of[gate_up][tokens <= 8 ? 0 : 1];
      const Fp8GemvShape s = shared_fp8_gemv_shape(a, gate_up);
      EXPECT_EQ(s.warps, want.warps) << "T=" << tokens << " gate_up=" << gate_up;
      EXPECT_EQ(s.stages, want.stages) << "T=" << tokens << " gate_up=" << gate_up;
    }
  a.tokens = 4;
  expect_a_forced_field_overrides_its_part(a, table.of[0][0]);
  a.tokens = 17;
  EXPECT_ERROR_CONTAINS(shared_fp8_gemv_shape(a, true), "up to 16 tokens, not 17");
}

// Auto's choice between the GEMV and wgmma forms: the GEMV form up to 16
// tokens, the wgmma form from 17, for DeepSeek-V4-Pro (H = 7168, Is = 3072)
// and V4-Flash (H = 4096, Is = 2048) alike; never without power-of-two
// factors. Host logic only.
TEST(SharedFp8, AutoTakesTheWgmmaFormFromSeventeenTokens) {
  Fp8WgmmaMaps maps;
  SharedFp8Args a = host_choice_args(maps);
  EXPECT_EQ(kFp8WgmmaMinTokens, 17);
  for (const auto& [hidden, inter, tokens, wgmma] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, bool>>{{7168, 3072, 8, false},  {7168, 3072, 16, false},
                                                                {7168, 3072, 17, true},  {4096, 2048, 16, false},
                                                                {4096, 2048, 17, true},  {7168, 3072, 64, true}}) {
    a.hidden = hidden;
    a.inter = inter;
    a.tokens = tokens;
    EXPECT_EQ(shared_fp8_uses_wgmma(a), wgmma) << "H=" << hidden << " Is=" << inter << " T=" << tokens;
  }
  a.hidden = 7168;
  a.inter = 3072;
  a.tokens = 64;  // the wgmma form's tokens, its factors not powers of two
  a.scales_fold = false;
  EXPECT_FALSE(shared_fp8_uses_wgmma(a));
}

TEST(SharedFp8, MatchesFp64OnRandomInputs) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  Rng rng(seed);
  const Fp8Case cases[] = {
      {1, 256, 128, 0, true},   {5, 272, 208, 0, false},  {8, 512, 384, 1, true},   {9, 272, 208, 3, true},
      {16, 384, 256, 8, false}, {31, 272, 208, 0, true},  {64, 512, 256, 2, false}, {65, 272, 208, 0, true},
      {200, 256, 144, 0, true}, {130, 384, 256, 4, false},
      // The GEMV form (up to 16 tokens; K tiles fewer than, equal to and more than its 4 warps).
      {1, 256, 128, 0, true, Fp8SharedPath::Gemv}, {7, 512, 384, 0, false, Fp8SharedPath::Gemv},
      {12, 640, 272, 0, true, Fp8SharedPath::Gemv}, {16, 1296, 208, 0, false, Fp8SharedPath::Gemv},
      // ... with two register stages, which the launcher takes for grids of more m-tiles than
      // three-stage CTAs fit on the SMs at once (small grids here take three).
      {1, 256, 128, 0, true, Fp8SharedPath::Gemv, 2}, {7, 512, 384, 0, false, Fp8SharedPath::Gemv, 2},
      {12, 640, 272, 0, true, Fp8SharedPath::Gemv, 2}, {16, 1296, 208, 0, false, Fp8SharedPath::Gemv, 2},
      // ... and with three-warp CTAs (every 3rd K tile a warp: K tiles fewer than, a multiple of and not
      // a multiple of 3), which it takes where only they fit the grid in one wave.
      {1, 256, 128, 0, true, Fp8SharedPath::Gemv, 2, 3}, {7, 512, 384, 0, false, Fp8SharedPath::Gemv, 2, 3},
      {12, 640, 272, 0, true, Fp8SharedPath::Gemv, 2, 3}, {16, 1296, 400, 0, false, Fp8SharedPath::Gemv, 2, 3},
      {9, 768, 384, 0, true, Fp8SharedPath::Gemv, 3, 3},
      {3, 272, 208, 2, true, Fp8SharedPath::Split},
      // The wgmma form (H, Is multiples of 64; power-of-two factors): widths 16, 32, 64, 128; one K
      // tile (the second warpgroup idle), odd and even counts of them; a partial last K tile (H = 576,
      // Is = 192), token tails; odd T draw arbitrary factors, so Auto takes the split form.
      {18, 512, 256, 0, true, Fp8SharedPath::Wgmma},   {64, 576, 192, 0, false, Fp8SharedPath::Wgmma},
      {40, 512, 384, 0, true, Fp8SharedPath::Wgmma},   {200, 576, 256, 0, true, Fp8SharedPath::Wgmma},
      {130, 512, 256, 0, false, Fp8SharedPath::Wgmma}, {2, 256, 128, 0, true, Fp8SharedPath::Wgmma},
      {16, 640, 192, 0, false, Fp8SharedPath::Wgmma},  {10, 128, 64, 0, true, Fp8SharedPath::Wgmma},
      {96, 512, 320, 0, false}, {33, 512, 320, 0, true}};
  for (const Fp8Case& c : cases) {
    SCOPED_TRACE(case_name(c, seed));
    const TileScales kind = c.tokens % 2 ? TileScales::Arbitrary : TileScales::PowersOfTwo;
    const SharedExpertWeights w = test::random_fp8_shared(rng, c.hidden, c.inter, kind);
    const std::vector<uint16_t> xb = random_bf16(rng, c.tokens * c.hidden);
    const Fp8Result r = run_fp8(c, xb, w);
    check_result(c, xb, w, r);
    const Fp8Result again = run_fp8(c, xb, w);
    EXPECT_EQ(again.out, r.out);
    EXPECT_EQ(again.h, r.h);
  }
}

// The prefill path's dequantization: every weight of a range of m-tiles of
// both projections as the checkpoint defines it (E4M3 value x tile scale),
// exactly, in the chunk's row order; H = 400 leaves a partial K tile.
TEST(SharedFp8, FragmentsToBf16AreTheDequantizedWeights) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Rng rng(seed);
  const int64_t H = 400, Is = 208;
  const SharedExpertWeights w = test::random_fp8_shared(rng, H, Is, TileScales::PowersOfTwo);
  std::vector<float> s13t = w.w1_scale;
  EXPECT_TRUE(fp8_scales_are_powers_of_two(s13t));
  s13t[0] *= 1.5f;
  EXPECT_FALSE(fp8_scales_are_powers_of_two(s13t));
  EXPECT_FALSE(fp8_scales_are_powers_of_two({0.0f}));
  EXPECT_FALSE(fp8_scales_are_powers_of_two({0x1p-120f}));
  std::vector<uint8_t> w13 = w.w1_fp8;
  w13.insert(w13.end(), w.w3_fp8.begin(), w.w3_fp8.end());
  std::vector<float> s13 = fp8_group_scales(w.w1_scale, Is, H);
  const std::vector<float> s3 = fp8_group_scales(w.w3_scale, Is, H), s2 = fp8_group_scales(w.w2_scale, H, Is);
  s13.insert(s13.end(), s3.begin(), s3.end());
  struct Proj {
    Fp8FragmentGeometry g;
    std::vector<uint8_t> packed;
    std::vector<float> table;
  };
  const Fp8FragmentGeometry g13{.rows = 2 * Is, .cols = H, .pairs = true}, g2{.rows = H, .cols = Is, .pairs = false};
  for (const Proj& p : {Proj{g13, fp8_fragments(w13, g13), s13}, Proj{g2, fp8_fragments(w.w2_fp8, g2), s2}}) {
    for (const int64_t u0 : {int64_t(0), int64_t(3)}) {
      const int64_t n = p.g.m_tiles() - u0 - (u0 ? 0 : 2), rows = fp8_chunk_rows(p.g, n);
      SCOPED_TRACE("pairs " + std::to_string(p.g.pairs) + " m-tiles " + std::to_string(u0) + " +" + std::to_string(n));
      DeviceBuffer<uint8_t> dw(p.packed.size());
      DeviceBuffer<float> ds(p.table.size());
      DeviceBuffer<uint16_t> dout(size_t(rows * p.g.cols));
      dw.upload(p.packed.data(), p.packed.size());
      ds.upload(p.table.data(), p.table.size());
      NVFP4_CUDA_CHECK(cudaMemset(dout.get(), 0xFF, dout.bytes()));
      fp8_fragments_to_bf16(dw.get(), p.g, ds.get(), u0, n, reinterpret_cast<__nv_bfloat16*>(dout.get()), nullptr);
      NVFP4_CUDA_CHECK(cudaDeviceSynchronize());
      std::vector<uint16_t> got(dout.size());
      dout.download(got.data(), got.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < p.g.cols; ++k) {
          double want;
          if (p.g.pairs) {
            const int64_t i = 8 * u0 + r % (8 * n);
            want = r < 8 * n ? weight_value(w.w1_fp8, w.w1_scale, H, i, k) : weight_value(w.w3_fp8, w.w3_scale, H, i, k);
          } else {
            want = weight_value(w.w2_fp8, w.w2_scale, Is, 16 * u0 + r, k);
          }
          ASSERT_EQ(double(bf16_to_float(Bf16{got[size_t(r * p.g.cols + k)]})), want) << "row " << r << " col " << k;
        }
    }
  }
}

}  // namespace
}  // namespace nvfp4moe::cuda
