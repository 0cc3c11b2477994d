// The multiplier bytes of the kernel layouts (scale_multiplier.hpp; host
// code, runs without a GPU): every NVFP4 scale byte and every MXFP4 byte of
// a window, times all 16 codes, through the kernels' own integer conversion
// and an emulated BF16 multiply, against value(q) * scale; the MXFP4 window's
// refusals; pack / unpack round trips of MXFP4 experts in both layouts.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cuda/layout/fragment_layout.hpp"
#include "cuda/layout/scale_multiplier.hpp"
#include "cuda/layout/tile_layout.hpp"
#include "cuda/layout/weight_upload.hpp"
#include "format/mxfp4_codec.hpp"
#include "nvfp4moe/types.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using cuda::LinearExpertProjection;
using cuda::Projection;

// The BF16 value of the fragment layout's pattern for `code` (all 8 codes of
// a word equal, register 0, half 0): what the kernel multiplies.
float fragment_code_value(uint8_t code) {
  uint8_t q[8];
  std::memset(q, code, sizeof q);
  uint32_t r[4];
  cuda::unpack_fragment_word(cuda::pack_fragment_word(q), r);
  return fmt::bits_to_float((r[0] & 0xffffu) << 16);
}

bool exact_bf16(float v) { return bf16_to_float(bf16_from_float(v)) == v; }
bool normal_or_zero(float v) { return v == 0.0f || std::fabs(v) >= 0x1p-126f; }

// The kernels' product of code and multiplier byte d (a BF16 multiply of two
// BF16 values, exact when the FP32 product is a normal BF16 value), checked
// to be exact; returns it.
float bf16_product(float a, uint32_t d, const std::string& what) {
  const float m = fmt::bits_to_float((cuda::scale_multiplier_bf16x2(d) & 0xffffu) << 16);
  EXPECT_EQ(cuda::scale_multiplier_bf16x2(d) >> 16, cuda::scale_multiplier_bf16x2(d) & 0xffffu) << what;
  EXPECT_TRUE(std::isfinite(m) && m >= 0x1p-126f) << what << ": multiplier " << m;
  const float p = a * m;  // both have at most 8 significant bits: exact in FP32
  EXPECT_TRUE(exact_bf16(p) && normal_or_zero(p)) << what << ": product " << p << " is not an exact normal BF16";
  return p;
}

TEST(ScaleMultiplier, EveryNvfp4ScaleByteTimesEveryCodeIsExact) {
  for (int b = 0; b <= 0x7E; ++b) {
    const uint8_t d = cuda::nvfp4_multiplier_byte(uint8_t(b));
    const float s = fmt::e4m3_value(uint8_t(b));
    EXPECT_EQ(d == 0, s == 0.0f) << "byte " << b;
    EXPECT_EQ(cuda::nvfp4_scale_byte(d), b == 0 ? 0 : b) << "byte " << b;
    if (d == 0) continue;
    EXPECT_EQ(cuda::scale_multiplier_value(d), s * cuda::kFragScaleBoost) << "byte " << b;
    EXPECT_EQ(cuda::tile_scale_value(d), s) << "byte " << b;
    for (int q = 0; q < 16; ++q) {
      const std::string what = "UE4M3 0x" + std::to_string(b) + " code " + std::to_string(q);
      const float p = bf16_product(fragment_code_value(uint8_t(q)), d, what);
      EXPECT_EQ(double(p) * cuda::kFragEpilogue, double(fmt::e2m1_value(uint8_t(q))) * s) << what;
      const float t = fmt::e2m1_value(uint8_t(q)) * cuda::tile_scale_value(d);
      EXPECT_TRUE(exact_bf16(t)) << what;
    }
  }
}

TEST(ScaleMultiplier, Mxfp4WindowTimesEveryCodeIsExact) {
  for (const int base : {0, 1, 60, 118, 127, 200, cuda::kMxfp4MaxBase}) {
    const float factor = cuda::mxfp4_row_group_factor(base);
    EXPECT_EQ(double(factor), std::ldexp(1.0, base - cuda::kMxfp4FactorShift)) << "base " << base;
    EXPECT_TRUE(std::isfinite(factor * cuda::kFragEpilogue)) << "base " << base;
    for (int b = base; b < base + cuda::kMxfp4Window && b <= 0xFC; ++b) {
      const uint8_t d = cuda::mxfp4_multiplier_byte(uint8_t(b), base);
      ASSERT_NE(d, 0) << "base " << base << " byte " << b;
      EXPECT_EQ(cuda::mxfp4_scale_byte(d, base), b);
      for (int q = 0; q < 16; ++q) {
        const std::string what = "base " + std::to_string(base) + " UE8M0 " + std::to_string(b) + " code " +
                                 std::to_string(q);
        const double want = double(fmt::mxfp4_value(uint8_t(q), uint8_t(b)));
        const float p = bf16_product(fragment_code_value(uint8_t(q)), d, what);
        EXPECT_EQ(double(p) * cuda::kFragEpilogue * factor, want) << what;
        const float t = fmt::e2m1_value(uint8_t(q)) * cuda::tile_scale_value(d);
        EXPECT_TRUE(exact_bf16(t) && normal_or_zero(t)) << what;
        EXPECT_EQ(double(t) * factor, want) << what;
      }
    }
  }
}

// One expert's gate/up projection: H = 128, I = 64 (gate rows 0..63, up 64..127).
struct Mx {
  int64_t H = 128, I = 64, rows = 128, kb32 = 4;
  std::vector<uint8_t> codes = std::vector<uint8_t>(size_t(128 * 64), 0x11), scales = std::vector<uint8_t>(512, 120);
  LinearExpertProjection view() const {
    return LinearExpertProjection{.format = ExpertFormat::Mxfp4,
                                  .projection = Projection::GateUp,
                                  .hidden = H,
                                  .inter = I,
                                  .codes = codes.data(),
                                  .scales = scales.data(),
                                  .expert = 7};
  }
  void encode(std::vector<uint8_t>& c, std::vector<uint8_t>& m, float (&f)[2]) const {
    c = codes;
    m.assign(size_t(rows * H / 16), 0xEE);
    cuda::encode_weight_scales(view(), c.data(), m.data(), f);
  }
};

TEST(ScaleMultiplier, Mxfp4EncodingPerRowGroupAndZeroBlocks) {
  Mx w;
  w.scales[3 * 4 + 1] = 100;  // gate row 3, block 1: the gate base
  w.scales[3 * 4 + 2] = 130;  // 30 binades above it: the window's edge
  w.scales[70 * 4 + 0] = 0;   // up row 70, block 0 holds only (signed) zero codes: not in the range
  std::memset(&w.codes[70 * 64], 0x88, 16);
  std::vector<uint8_t> c, m;
  float f[2];
  w.encode(c, m, f);
  EXPECT_EQ(f[0], cuda::mxfp4_row_group_factor(100));
  EXPECT_EQ(f[1], cuda::mxfp4_row_group_factor(120));
  EXPECT_EQ(m[3 * 8 + 2], cuda::mxfp4_multiplier_byte(100, 100));
  EXPECT_EQ(m[3 * 8 + 3], cuda::mxfp4_multiplier_byte(100, 100)) << "a 32-block's byte covers both 16-blocks";
  EXPECT_EQ(m[3 * 8 + 4], 31 << 3);
  EXPECT_EQ(m[70 * 8 + 0], 0);
  EXPECT_EQ(m[70 * 8 + 1], 0);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(c[70 * 64 + i], 0) << "the zero block's codes are stored as zero";
  EXPECT_EQ(c[70 * 64 + 16], 0x11);
  std::vector<uint8_t> back(w.scales.size());
  cuda::decode_weight_scales(ExpertFormat::Mxfp4, Projection::GateUp, w.H, w.I, m.data(), f, back.data());
  std::vector<uint8_t> want = w.scales;
  want[70 * 4] = 120;  // a zero block comes back as its row group's base
  EXPECT_BYTES_EQ(back.data(), want.data(), int64_t(want.size()), "decoded MXFP4 scales");
}

TEST(ScaleMultiplier, Mxfp4RefusesWhatTheWindowCannotHoldNamingIt) {
  std::vector<uint8_t> c, m;
  float f[2];
  Mx wide;
  wide.scales[80 * 4 + 3] = 151;  // up row 80, block 3: 31 binades above the rest (120)
  EXPECT_ERROR_CONTAINS(wide.encode(c, m, f), "MXFP4 expert 7 w13 up", "UE8M0 byte 0x97", "row 80, block 3",
                        "2^31 times", "0x78", "at most 31 binades");
  Mx huge;
  for (int64_t i = 0; i < 256; ++i) huge.scales[size_t(i)] = 0xE2;  // every gate block at 2^99
  EXPECT_ERROR_CONTAINS(huge.encode(c, m, f), "MXFP4 expert 7 w13 gate", "at least 0xe2", "overflows");
  Mx ok;
  for (int64_t i = 0; i < 256; ++i) ok.scales[size_t(i)] = cuda::kMxfp4MaxBase;
  EXPECT_NO_THROW(ok.encode(c, m, f));
}

TEST(ScaleMultiplier, Nvfp4ZeroScaleBlocksStoreZeroCodes) {
  const int64_t H = 128, I = 8;
  std::vector<uint8_t> codes(size_t(2 * I * H / 2), 0x77), scales(size_t(2 * I * H / 16), 0x38);
  scales[5] = 0;
  const LinearExpertProjection w{.projection = Projection::GateUp, .hidden = H, .inter = I, .codes = codes.data(),
                                 .scales = scales.data()};
  std::vector<uint8_t> c = codes, m(scales.size());
  cuda::encode_weight_scales(w, c.data(), m.data(), nullptr);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(c[5 * 8 + i], 0);
  EXPECT_EQ(c[4 * 8], 0x77);
  EXPECT_EQ(m[5], 0);
  EXPECT_EQ(m[0], cuda::nvfp4_multiplier_byte(0x38));
}

// Random MXFP4 experts with a window-wide spread of scales, through encode
// and pack, back through unpack and decode: the same codes and bytes.
TEST(ScaleMultiplier, Mxfp4PackUnpackRoundTripsBothLayouts) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  test::Rng rng(seed);
  const int64_t H = 256, I = 128;
  ExpertWeights ex = test::random_mxfp4_experts(rng, 1, H, I);
  for (auto* s : {&ex.w13_scales, &ex.w2_scales})
    for (auto& b : *s) b = uint8_t(100 + rng.below(cuda::kMxfp4Window));
  for (Projection p : {Projection::GateUp, Projection::Down}) {
    SCOPED_TRACE(p == Projection::GateUp ? "gate/up" : "down");
    const bool gu = p == Projection::GateUp;
    const std::vector<uint8_t>& codes = gu ? ex.w13_codes : ex.w2_codes;
    const std::vector<uint8_t>& scales = gu ? ex.w13_scales : ex.w2_scales;
    // Nibbles with magnitude 0 only would make zero blocks; the generator's random bytes make none that matter.
    const LinearExpertProjection w{.format = ExpertFormat::Mxfp4, .projection = p, .hidden = H, .inter = I,
                                   .codes = codes.data(), .scales = scales.data()};
    const int64_t rows = gu ? 2 * I : H, k = gu ? H : I;
    float f[2] = {0, 0};
    const auto fg = cuda::fragment_geometry(p, H, I, ExpertFormat::Mxfp4);
    // One multiplier byte per 32 weights on the device, as in the checkpoint: 4.25 bits a weight.
    EXPECT_EQ(fg.scale_bytes_per_expert(), rows * k / 32);
    EXPECT_EQ(fg.scale_bytes_per_expert() * 2, cuda::fragment_geometry(p, H, I).scale_bytes_per_expert());
    std::vector<uint8_t> pc(size_t(fg.code_bytes_per_expert())), ps(size_t(fg.scale_bytes_per_expert()));
    cuda::pack_fragment_expert(w, pc.data(), ps.data(), f);
    std::vector<uint8_t> uc(codes.size()), um(size_t(rows * k / 16)), us(scales.size());
    cuda::unpack_fragment_weights(p, pc.data(), ps.data(), H, I, uc.data(), um.data(), ExpertFormat::Mxfp4);
    cuda::decode_weight_scales(ExpertFormat::Mxfp4, p, H, I, um.data(), f, us.data());
    EXPECT_BYTES_EQ(uc.data(), codes.data(), int64_t(codes.size()), "fragment layout codes");
    EXPECT_BYTES_EQ(us.data(), scales.data(), int64_t(scales.size()), "fragment layout scales");

    std::vector<uint8_t> tile(size_t(cuda::packed_geometry(p, H, I).bytes_per_expert()));
    float ft[2] = {0, 0};
    cuda::pack_tile_expert(w, tile.data(), ft);
    EXPECT_EQ(f[0], ft[0]);
    std::vector<uint8_t> tc(codes.size()), tm(um.size()), ts(scales.size());
    cuda::unpack_expert_weights(p, tile.data(), H, I, tc.data(), tm.data());
    cuda::decode_weight_scales(ExpertFormat::Mxfp4, p, H, I, tm.data(), ft, ts.data());
    EXPECT_BYTES_EQ(tc.data(), codes.data(), int64_t(codes.size()), "tile layout codes");
    EXPECT_BYTES_EQ(ts.data(), scales.data(), int64_t(scales.size()), "tile layout scales");

    // The fragment layout stores a 32-column block's byte once: halves that differ are refused.
    std::vector<uint8_t> mult = um;
    mult[size_t(3 * (k / 16) + 5)] ^= 1;  // row 3, the second half of block 2
    EXPECT_ERROR_CONTAINS(cuda::pack_fragment_weights(p, uc.data(), mult.data(), H, I, pc.data(), ps.data(),
                                                      ExpertFormat::Mxfp4),
                          "blocks 4 and 5");
  }
}

}  // namespace
}  // namespace nvfp4moe
