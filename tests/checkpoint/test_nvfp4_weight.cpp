// read_nvfp4_weight, the one validation of a ModelOpt NVFP4 triple: what it
// accepts, every way a triple can be malformed (each an error naming the
// tensor), and how much data each depth reads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/nvfp4_weight.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

// A triple of N = 4 rows, K = 32: codes, scales, global scale; `edit` changes it before writing.
struct Triple {
  std::vector<uint8_t> codes = std::vector<uint8_t>(4 * 16, 0x21);
  std::vector<uint8_t> scales = std::vector<uint8_t>(4 * 2, 0x38);
  float global = 0.5f, input = 2.0f;
  DType scale_dtype = DType::F8E4M3;
  bool with_codes = true, with_scales = true, with_global = true, with_input = false;
};

std::string write(const ScratchDir& d, const Triple& t) {
  SafetensorsWriter w;
  if (t.with_codes) w.add("p.weight", DType::U8, {4, 16}, t.codes.data());
  if (t.with_scales) w.add("p.weight_scale", t.scale_dtype, {4, 2}, t.scales.data());
  if (t.with_global) w.add("p.weight_scale_2", DType::F32, {}, &t.global);
  if (t.with_input) w.add("p.input_scale", DType::F32, {1}, &t.input);
  const std::string path = d / "t.safetensors";
  w.write(path);
  return path;
}

TEST(Nvfp4Weight, AcceptsAWellFormedTriple) {
  ScratchDir d;
  Triple t;
  t.with_input = true;
  const SafetensorsFile f(write(d, t));
  const Nvfp4Weight w = read_nvfp4_weight(f, "p", std::nullopt, Nvfp4Read::Everything);
  EXPECT_EQ(w.rows, 4);
  EXPECT_EQ(w.cols, 32);
  EXPECT_EQ(w.global_scale, 0.5f);
  EXPECT_EQ(w.input_scale, std::optional<float>(2.0f));
  EXPECT_EQ(w.codes->name, "p.weight");
  EXPECT_EQ(w.scales->name, "p.weight_scale");
  EXPECT_EQ(read_nvfp4_weight(f, "p", std::pair<int64_t, int64_t>{4, 32}, Nvfp4Read::Everything).cols, 32);
}

TEST(Nvfp4Weight, EveryMalformedTripleNamesTheTensor) {
  struct Case {
    const char* label;
    void (*edit)(Triple&);
    std::string message;
  };
  const Case cases[] = {
      {"NaN block scale", [](Triple& t) { t.scales[5] = 0x7F; },
       "tensor \"p.weight_scale\": block scale byte 5 (row 2, block 1) is NaN (0x7f)"},
      {"negative block scale", [](Triple& t) { t.scales[0] = 0xB8; },
       "tensor \"p.weight_scale\": block scale byte 0 (row 0, block 0) is negative (0xb8)"},
      {"missing weight_scale", [](Triple& t) { t.with_scales = false; },
       "missing tensor \"p.weight_scale\" of the NVFP4 weight p"},
      {"missing weight_scale_2", [](Triple& t) { t.with_global = false; },
       "missing tensor \"p.weight_scale_2\" of the NVFP4 weight p"},
      {"missing codes", [](Triple& t) { t.with_codes = false; }, "missing tensor \"p.weight\" of the NVFP4 weight p"},
      {"U8 scales", [](Triple& t) { t.scale_dtype = DType::U8; },
       "tensor \"p.weight_scale\": dtype U8, expected F8_E4M3"},
      {"NaN global scale", [](Triple& t) { t.global = NAN; }, "tensor \"p.weight_scale_2\": global scale is nan"},
      {"zero global scale", [](Triple& t) { t.global = 0.0f; }, "global scale is 0 (must be finite and > 0)"},
      {"bad input scale", [](Triple& t) { t.with_input = true, t.input = -INFINITY; },
       "tensor \"p.input_scale\": global scale is -inf"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.label);
    ScratchDir d;
    Triple t;
    c.edit(t);
    const SafetensorsFile f(write(d, t));
    EXPECT_ERROR_CONTAINS(read_nvfp4_weight(f, "p", std::nullopt, Nvfp4Read::Everything), c.message);
  }
  // Shapes: against the caller's geometry, and K from codes a multiple of 16.
  ScratchDir d;
  const SafetensorsFile f(write(d, Triple{}));
  EXPECT_ERROR_CONTAINS(read_nvfp4_weight(f, "p", std::pair<int64_t, int64_t>{4, 64}, Nvfp4Read::Headers),
                        "tensor \"p.weight\": shape [4, 16], expected [4, 32]");
  SafetensorsWriter w;
  const std::vector<uint8_t> codes(4 * 4), scales(4);
  const float g = 1;
  w.add("q.weight", DType::U8, {4, 4}, codes.data());
  w.add("q.weight_scale", DType::F8E4M3, {4, 1}, scales.data());
  w.add("q.weight_scale_2", DType::F32, {}, &g);
  w.write(d / "k8.safetensors");
  EXPECT_ERROR_CONTAINS(read_nvfp4_weight(SafetensorsFile(d / "k8.safetensors"), "q", std::nullopt, Nvfp4Read::Headers),
                        "tensor \"q.weight\": K = 8 is not a multiple of 16");
}

TEST(Nvfp4Weight, DepthDecidesWhatIsRead) {
  ScratchDir d;
  Triple t;
  t.global = NAN;
  t.scales[3] = 0xFF;
  const SafetensorsFile f(write(d, t));
  EXPECT_NO_THROW(read_nvfp4_weight(f, "p", std::nullopt, Nvfp4Read::Headers));  // no data read
  EXPECT_ERROR_CONTAINS(read_nvfp4_weight(f, "p", std::nullopt, Nvfp4Read::Scalars), "global scale is nan");
  t.global = 1.0f;
  const SafetensorsFile f2(write(d, t));
  EXPECT_NO_THROW(read_nvfp4_weight(f2, "p", std::nullopt, Nvfp4Read::Scalars));  // block bytes not read
  EXPECT_ERROR_CONTAINS(read_nvfp4_weight(f2, "p", std::nullopt, Nvfp4Read::Everything), "byte 3 (row 1, block 1)");
}

}  // namespace
}  // namespace nvfp4moe
