// The block-scale rule of every NVFP4 reader (format/nvfp4_validate.hpp),
// over all 256 byte values, and the message that locates a bad byte.
#include <gtest/gtest.h>

#include <vector>

#include "format/nvfp4_validate.hpp"
#include "nvfp4moe/format.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

TEST(Nvfp4Validate, EveryByteValue) {
  for (int b = 0; b < 256; ++b) {
    SCOPED_TRACE(b);
    const float v = e4m3_decode(uint8_t(b));
    const ScaleByteFault f = block_scale_fault(uint8_t(b));
    if (std::isnan(v)) {
      EXPECT_EQ(f, ScaleByteFault::NaN);
    } else if (std::signbit(v)) {  // includes 0x80, -0: not a UE4M3 byte
      EXPECT_EQ(f, ScaleByteFault::Negative);
    } else {
      EXPECT_EQ(f, ScaleByteFault::None);
    }
  }
  EXPECT_EQ(block_scale_fault(0x7F), ScaleByteFault::NaN);
  EXPECT_EQ(block_scale_fault(0xFF), ScaleByteFault::NaN);
  EXPECT_EQ(block_scale_fault(0xB8), ScaleByteFault::Negative);
  EXPECT_EQ(block_scale_fault(0x7E), ScaleByteFault::None);  // 448, the largest
}

TEST(Nvfp4Validate, FirstBadByteIsLocated) {
  std::vector<uint8_t> s(4 * 3, 0x38);
  EXPECT_EQ(first_bad_block_scale(s.data(), int64_t(s.size())), -1);
  EXPECT_NO_THROW(check_block_scales(s.data(), 4, 3, "tensor \"w\""));
  s[7] = 0xB8;
  s[10] = 0x7F;
  EXPECT_EQ(first_bad_block_scale(s.data(), int64_t(s.size())), 7);
  EXPECT_ERROR_CONTAINS(check_block_scales(s.data(), 4, 3, "tensor \"w\""),
                        "tensor \"w\": block scale byte 7 (row 2, block 1) is negative (0xb8); UE4M3 block scales "
                        "must be finite and >= 0");
  s[7] = 0x38;
  EXPECT_ERROR_CONTAINS(check_block_scales(s.data(), 4, 3, "w"), "byte 10 (row 3, block 1) is NaN (0x7f)");
}

TEST(Nvfp4Validate, FirstBadByteAcrossChunks) {
  // The scan tests whole chunks first: a bad byte is found wherever it lies
  // (either side of a chunk edge, the last byte of a ragged tail), and the
  // earliest of several is the one reported.
  const int64_t n = 3 * 4096 + 37;
  for (int64_t at : {int64_t(0), int64_t(4095), int64_t(4096), int64_t(8191), n - 1}) {
    for (uint8_t bad : {uint8_t(0x7F), uint8_t(0x80), uint8_t(0xFE), uint8_t(0xFF)}) {
      SCOPED_TRACE("byte " + std::to_string(at) + " = " + std::to_string(bad));
      std::vector<uint8_t> s(size_t(n), 0x7E);  // 448, the largest good byte
      s[size_t(at)] = bad;
      EXPECT_EQ(first_bad_block_scale(s.data(), n), at);
      if (at + 5000 < n) s[size_t(at + 5000)] = 0xFF;
      EXPECT_EQ(first_bad_block_scale(s.data(), n), at);
    }
  }
  std::vector<uint8_t> clean(size_t(n), 0x7E);
  EXPECT_EQ(first_bad_block_scale(clean.data(), n), -1);
  EXPECT_EQ(first_bad_block_scale(clean.data(), 0), -1);
}

}  // namespace
}  // namespace nvfp4moe
