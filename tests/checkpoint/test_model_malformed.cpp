// Every malformed tensor of a DeepSeek-layout MoE layer that the loader
// handles is an error naming the tensor and the offending value: FP8 shared
// experts (NaN E8M0 byte 0xFF, wrong dtype or shape, missing or doubled scale,
// NaN weight byte, mixed formats), routed NVFP4 experts, router and tid2eid,
// and a manifest that gives NVFP4 groups other than 16.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/error.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

std::vector<uint8_t> f32s(std::vector<float> v) { return test::as_bytes(v); }

std::vector<uint8_t> fp8_with_nan_at(size_t n, size_t at) {
  std::vector<uint8_t> b(n, 0x38);
  b[at] = 0x7F;
  return b;
}

std::vector<uint8_t> tid2eid_with(int64_t at, int32_t expert) {
  std::vector<int32_t> t(size_t(test::FixtureModel::kVocab * 2), 1);
  t[size_t(at)] = expert;
  return test::as_bytes(t);
}

struct Case {
  const char* label;
  int layer;
  std::string tensor;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // empty: the tensor is removed
  std::vector<std::string> message;
  std::string also_removed = "";  // a second tensor removed first
};

std::vector<Case> cases() {
  const std::string s = "layers.1.ffn.shared_experts.", e = "layers.1.ffn.experts.";
  return {
      {"NaN E8M0 tile scale", 1, s + "w3.scale", DType::F8E8M0, {2, 2}, {127, 0xFF, 127, 127},
       {"tensor \"" + s + "w3.scale\"", "scale byte 1 (tile 0, 1) is NaN (0xff)"}},
      {"tile scale dtype", 1, s + "w3.scale", DType::U8, {2, 2}, {127, 127, 127, 127},
       {"tensor \"" + s + "w3.scale\"", "dtype U8, expected F8_E8M0 or F32"}},
      {"tile scale shape", 1, s + "w2.scale", DType::F8E8M0, {1, 2}, {127, 127},
       {"tensor \"" + s + "w2.scale\"", "shape [1, 2], expected [2, 2]"}},
      {"missing tile scale", 1, s + "w2.scale", DType::F8E8M0, {}, {},
       {"missing tensor \"" + s + "w2.scale\"", "weight_scale_inv", "128x128 tile scales"}},
      {"negative F32 tile scale", 1, s + "w1.scale", DType::F32, {2, 2}, f32s({1, 1, -1, 1}),
       {"tensor \"" + s + "w1.scale\"", "scale of tile (1, 0) is -1"}},
      {"both tile scale names", 1, s + "w1.weight_scale_inv", DType::F32, {2, 2}, f32s({1, 1, 1, 1}),
       {s + "w1.scale\" and \"" + s + "w1.weight_scale_inv\" both given"}},
      {"NaN FP8 weight byte", 1, s + "w1.weight", DType::F8E4M3, {160, 256}, fp8_with_nan_at(160 * 256, 300),
       {"tensor \"" + s + "w1.weight\"", "weight byte 300 (row 1, column 44) is NaN (0x7f)"}},
      {"FP8 weight shape", 1, s + "w3.weight", DType::F8E4M3, {160, 128}, std::vector<uint8_t>(160 * 128, 0x38),
       {"tensor \"" + s + "w3.weight\"", "shape [160, 128], expected [160, 256]"}},
      {"shared weight of no known format", 1, s + "w1.weight", DType::F16, {160, 256},
       std::vector<uint8_t>(160 * 256 * 2, 0),
       {"layers.1 (layer 1): the shared expert's weight is unknown", s + "w1.weight F16 [160, 256] with .scale"}},
      {"shared formats mixed", 1, s + "w2.weight", DType::BF16, {256, 160}, std::vector<uint8_t>(256 * 160 * 2, 0),
       {"the shared expert mixes formats", s + "w1.weight F8_E4M3", "is FP8 but", s + "w2.weight BF16"},
       s + "w2.scale"},
      {"missing routed global scale", 1, e + "6.w3.weight_scale_2", DType::F32, {}, {},
       {"missing tensor \"" + e + "6.w3.weight_scale_2\""}},
      {"NaN routed global scale", 1, e + "6.w1.weight_scale_2", DType::F32, {}, f32s({NAN}),
       {"tensor \"" + e + "6.w1.weight_scale_2\"", "global scale is nan"}},
      {"routed code dtype", 1, e + "2.w1.weight", DType::I8, {160, 128}, std::vector<uint8_t>(160 * 128),
       {"tensor \"" + e + "2.w1.weight\"", "dtype I8, expected U8"}},
      {"NaN routed block scale", 1, e + "3.w2.weight_scale", DType::F8E4M3, {256, 10}, std::vector<uint8_t>(2560, 0xFF),
       {"tensor \"" + e + "3.w2.weight_scale\"", "block scale byte 0 (row 0, block 0) is NaN (0xff)"}},
      {"router bias shape", 1, "layers.1.ffn.gate.bias", DType::F32, {4}, f32s({0, 0, 0, 0}),
       {"tensor \"layers.1.ffn.gate.bias\"", "shape [4], expected [8]"}},
      {"missing router", 2, "layers.2.ffn.gate.weight", DType::F32, {}, {},
       {"missing tensor \"layers.2.ffn.gate.weight\""}},
      {"tid2eid entry out of range", 0, "layers.0.ffn.gate.tid2eid", DType::I32, {64, 2}, tid2eid_with(9, 8),
       {"tensor \"layers.0.ffn.gate.tid2eid\"", "entry 9 (token 4) is expert 8, outside [0, E=8)"}},
      {"tid2eid dtype", 0, "layers.0.ffn.gate.tid2eid", DType::F32, {64, 2}, std::vector<uint8_t>(64 * 2 * 4),
       {"tensor \"layers.0.ffn.gate.tid2eid\"", "dtype F32, expected I32"}},
      {"missing tid2eid", 0, "layers.0.ffn.gate.tid2eid", DType::I32, {}, {},
       {"missing tensor \"layers.0.ffn.gate.tid2eid\""}},
  };
}

TEST(ModelMalformed, EveryBadTensorIsAnErrorNamingIt) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  ScratchDir d;
  test::write_deepseek_layout(test::make_fixture_model(seed), d / "base");
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    const std::string dir = d / "case";
    std::filesystem::remove_all(dir);
    std::filesystem::copy(d / "base", dir, std::filesystem::copy_options::recursive);
    EXPECT_NO_THROW(load_moe_layer(ModelDir(dir), c.layer));  // the layer loads as written
    if (!c.also_removed.empty()) test::replace_in_model(dir, c.also_removed, DType::U8, {}, {});
    test::replace_in_model(dir, c.tensor, c.dtype, c.shape, c.bytes);
    bool thrown = false;
    try {
      load_moe_layer(ModelDir(dir), c.layer);
    } catch (const Error& err) {
      thrown = true;
      for (const std::string& want : c.message)
        EXPECT_NE(std::string(err.what()).find(want), std::string::npos) << err.what() << "\nlacks: " << want;
    }
    EXPECT_TRUE(thrown);
  }
}

TEST(ModelMalformed, ManifestWithNvfp4GroupsOtherThan16) {
  ScratchDir d;
  test::write_deepseek_layout(test::make_fixture_model(3), d.path());
  test::write_text(d / "hf_quant_config.json",
                   R"({"quantization": {"quant_algo": "MIXED_PRECISION", "quantized_layers": {
                       "layers.1.ffn.experts": {"quant_algo": "NVFP4", "group_size": 32}}}})");
  const ModelDir md(d.path());
  EXPECT_EQ(md.quant_manifest().group_size_of("layers.1.ffn.experts"), 32);
  EXPECT_ERROR_CONTAINS(load_moe_layer(md, 1), "manifest gives layers.1.ffn.experts NVFP4 with group_size 32");
  EXPECT_NO_THROW(load_moe_layer(md, 2));  // not listed: the tensors decide
  test::write_text(d / "hf_quant_config.json", R"({"quantization": {"quantized_layers": {"x": 1}}})");
  EXPECT_ERROR_CONTAINS(ModelDir(d.path()), "hf_quant_config.json", "quantized_layers[\"x\"] must be an object");
}

}  // namespace
}  // namespace nvfp4moe
