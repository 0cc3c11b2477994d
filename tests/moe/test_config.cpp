// ExpertWeights::validate on weights handed in through the C++ API: the
// block-scale rule of every checkpoint reader (0x7F/0xFF NaN, sign bit set)
// applies to NVFP4 experts, located by expert, row and block; MXFP4 experts'
// UE8M0 bytes (where 0x80 and above are ordinary powers of two) are not
// judged by it.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "nvfp4moe/moe.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::test {
namespace {

TEST(ExpertWeightsValidate, BadBlockScaleBytesAreRefusedNamingExpertRowAndBlock) {
  const MoeConfig c = small_config(64, 32, 4, 2);
  const MoeWeights good = make_synthetic_moe(c, 9);
  ASSERT_NO_THROW(good.experts.validate());
  const int64_t H = c.hidden, I = c.intermediate;
  struct Case {
    bool w13;
    int64_t expert, row, block;
    uint8_t byte;
    const char* fault;
  };
  const Case cases[] = {{true, 0, 0, 0, 0x7F, "NaN"},      {true, 2, 40, 3, 0xFF, "NaN"},
                        {true, 3, 63, 3, 0x80, "negative"}, {false, 1, 5, 1, 0xB8, "negative"},
                        {false, 3, 63, 1, 0xFE, "negative"}};
  for (const Case& k : cases) {
    const std::string name = k.w13 ? "w13_scales" : "w2_scales";
    SCOPED_TRACE(name + " expert " + std::to_string(k.expert) + " row " + std::to_string(k.row) + " block " +
                 std::to_string(k.block) + " byte " + std::to_string(k.byte));
    for (int64_t first : {int64_t(0), int64_t(8)}) {  // expert ids in messages are global
      MoeWeights w = good;
      w.experts.first_expert = first;
      std::vector<uint8_t>& s = k.w13 ? w.experts.w13_scales : w.experts.w2_scales;
      const int64_t rows = k.w13 ? 2 * I : H, blocks = (k.w13 ? H : I) / 16;
      s[size_t((k.expert * rows + k.row) * blocks + k.block)] = k.byte;
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%x", unsigned(k.byte));
      EXPECT_ERROR_CONTAINS(w.experts.validate(), "ExpertWeights (NVFP4): " + name,
                            "of expert " + std::to_string(first + k.expert) + ": block scale byte " + hex,
                            "at row " + std::to_string(k.row) + " block " + std::to_string(k.block) + " is " + k.fault);
      if (first == 0) {
        // A layer built from these weights is refused before any work.
        MoeOptions o;
        o.backend = Backend::Cpu;
        EXPECT_ERROR_CONTAINS(Moe(w, o), "ExpertWeights (NVFP4): " + name);
      }
    }
  }
}

TEST(ExpertWeightsValidate, TheUe4m3RuleIsNotAppliedToMxfp4Scales) {
  ExpertWeights x;
  x.format = ExpertFormat::Mxfp4;
  x.count = 1;
  x.hidden = 64;
  x.intermediate = 32;
  x.w13_codes.assign(2 * 32 * 64 / 2, 0x21);
  x.w2_codes.assign(64 * 32 / 2, 0x21);
  x.w13_scales.assign(2 * 32 * 64 / 32, 0x85);  // 2^6 in UE8M0; a "negative" byte in UE4M3
  x.w2_scales.assign(64 * 32 / 32, 0x7F);       // 2^0 in UE8M0; NaN in UE4M3
  EXPECT_NO_THROW(x.validate());
}

}  // namespace
}  // namespace nvfp4moe::test
