// `nvfp4moe inspect` on whole model directories of both layouts: the
// per-layer summary (routed and shared formats, router kind, scale ranges,
// the manifest, whether the layer loads) in text and in --json, read from
// headers and small scale tensors only, and malformed tensors reported
// naming the tensor while the command still succeeds.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::FixtureModel;
using test::ScratchDir;

std::pair<float, float> min_max(std::initializer_list<const std::vector<float>*> vs) {
  float lo = INFINITY, hi = -INFINITY;
  for (const auto* v : vs)
    for (float x : *v) lo = std::min(lo, x), hi = std::max(hi, x);
  return {lo, hi};
}

void expect_range(const json::Value& layer, const char* key, std::pair<float, float> want, int64_t count) {
  SCOPED_TRACE(key);
  const json::Value* r = layer.find(key);
  ASSERT_TRUE(r && r->is_object());
  EXPECT_EQ(float(r->find("min")->as_double()), want.first);
  EXPECT_EQ(float(r->find("max")->as_double()), want.second);
  EXPECT_EQ(r->find("count")->as_int(), count);
}

using InspectModel = test::ModelDirsTest;

TEST_F(InspectModel, DeepSeekLayoutSummaryInText) {
  const test::ToolRun r = test::run_tool("inspect " + (dir_ / "a"));
  ASSERT_EQ(r.code, 0) << r.err;
  for (const char* want : {"381 tensors, quant_algo MIXED_PRECISION, deepseek layout",
                           "layer 1      24 NVFP4 (ModelOpt) weights, 6 other weights", "MoE layers (4):",
                           "MoE config: H=256 I=160 E=8 top_k=2 shared=1 rho=1.5"})
    EXPECT_NE(r.out.find(want), std::string::npos) << want << "\n" << r.out;
  auto line = [&](const std::string& block) {
    const size_t at = r.out.find("\n  " + block + " ");
    return at == std::string::npos ? std::string() : r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  };
  for (const char* want : {"experts NVFP4 x8", "shared FP8", "router hash ", "manifest NVFP4", "  loadable"})
    EXPECT_NE(line("layers.0").find(want), std::string::npos) << want << " in: " << line("layers.0");
  EXPECT_NE(line("layers.2").find("router scored+bias"), std::string::npos) << line("layers.2");
  for (const char* want : {"experts MXFP4 x8", "weight_scale_2 -", "manifest -", "  loadable"})
    EXPECT_NE(line("mtp.0").find(want), std::string::npos) << want << " in: " << line("mtp.0");
  EXPECT_EQ(r.out.find("MALFORMED"), std::string::npos) << r.out;
}

TEST_F(InspectModel, JsonValuesOfBothLayouts) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const char* which : {"a", "b"}) {
    SCOPED_TRACE(which);
    const test::ToolRun r = test::run_tool("inspect --json " + (dir_ / which));
    ASSERT_EQ(r.code, 0) << r.err;
    const json::Value j = json::parse(r.out);
    const bool ds = which[0] == 'a';
    EXPECT_EQ(j.find("layout")->as_string(), ds ? "deepseek" : "huggingface");
    EXPECT_EQ(j.find("tensor_count")->as_int(), int64_t(j.find("tensors")->items().size()));
    const auto& layers = j.find("moe_layers")->items();
    ASSERT_EQ(layers.size(), ds ? 4u : 3u);
    for (int L = 0; L < FixtureModel::kLayers; ++L) {
      SCOPED_TRACE("layer " + std::to_string(L));
      const json::Value& l = layers[size_t(L)];
      const MoeWeights& w = model_.layers[size_t(L)];
      EXPECT_EQ(l.find("block")->as_string(), (ds ? "layers." : "model.layers.") + std::to_string(L));
      EXPECT_EQ(l.find("index")->as_int(), L);
      EXPECT_FALSE(l.find("mtp")->as_bool());
      EXPECT_EQ(l.find("experts")->as_int(), 8);
      EXPECT_EQ(l.find("routed_format")->as_string(), "NVFP4");
      EXPECT_EQ(l.find("shared_format")->as_string(), "FP8");
      EXPECT_EQ(l.find("router")->as_string(), L == 0 ? "hash" : "scored");
      EXPECT_EQ(l.find("bias")->as_bool(), L != 0);
      EXPECT_EQ(l.find("manifest_algo")->as_string(), "NVFP4");
      EXPECT_TRUE(l.find("loadable")->as_bool());
      EXPECT_TRUE(l.find("problems")->items().empty());
      expect_range(l, "weight_scale_2", min_max({&w.experts.w13_global, &w.experts.w2_global}), 24);
      expect_range(l, "input_scale", min_max({&w.experts.w13_input_scale, &w.experts.w2_input_scale}), 24);
      expect_range(l, "shared_scale", min_max({&w.shared.w1_scale, &w.shared.w3_scale, &w.shared.w2_scale}), 12);
    }
    if (!ds) continue;
    const json::Value& mtp = layers[3];
    EXPECT_EQ(mtp.find("block")->as_string(), "mtp.0");
    EXPECT_TRUE(mtp.find("mtp")->as_bool());
    EXPECT_EQ(mtp.find("routed_format")->as_string(), "MXFP4");
    EXPECT_TRUE(mtp.find("loadable")->as_bool());
    EXPECT_EQ(mtp.find("manifest_algo")->as_string(), "");  // "mtp.*" is excluded
    EXPECT_TRUE(mtp.find("weight_scale_2")->is_null());
    expect_range(mtp, "shared_scale",
                 min_max({&model_.mtp.shared.w1_scale, &model_.mtp.shared.w3_scale, &model_.mtp.shared.w2_scale}), 12);
  }
}

TEST_F(InspectModel, SummaryAndHeadersOnlyReadLess) {
  test::ToolRun r = test::run_tool("inspect --json --summary --headers-only " + (dir_ / "a"));
  ASSERT_EQ(r.code, 0) << r.err;
  const json::Value j = json::parse(r.out);
  EXPECT_EQ(j.find("tensors"), nullptr);
  EXPECT_EQ(j.find("nvfp4"), nullptr);
  EXPECT_FALSE(j.find("block_scales_read")->as_bool());
  const json::Value& l1 = j.find("moe_layers")->items()[1];
  EXPECT_TRUE(l1.find("weight_scale_2")->is_null());  // no tensor data read
  EXPECT_TRUE(l1.find("shared_scale")->is_null());
  EXPECT_EQ(l1.find("routed_format")->as_string(), "NVFP4");  // told from the headers
  r = test::run_tool("inspect --summary " + (dir_ / "b"));
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("model.layers.0.mlp.experts.0.gate_proj.weight "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("MoE layers (3):"), std::string::npos) << r.out;
  r = test::run_tool("inspect --bogus 1 " + (dir_ / "b"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("unknown option --bogus"), std::string::npos) << r.err;
}

TEST_F(InspectModel, MalformedTensorsAreReportedNamingThem) {
  const std::string a = dir_ / "a";
  test::replace_in_model(a, "layers.1.ffn.shared_experts.w3.scale", DType::F8E8M0, {2, 2}, {127, 0xFF, 127, 127});
  test::replace_in_model(a, "layers.2.ffn.experts.2.w3.weight", DType::U8, {}, {});
  test::replace_in_model(a, "layers.2.ffn.experts.4.w1.weight_scale_2", DType::F32, {}, test::as_bytes(std::vector<float>{-1}));
  test::replace_in_model(a, "layers.0.ffn.gate.tid2eid", DType::U8, {}, {});
  const test::ToolRun r = test::run_tool("inspect --json --summary " + a);
  ASSERT_EQ(r.code, 0) << r.err;
  const json::Value j = json::parse(r.out);
  const auto& layers = j.find("moe_layers")->items();
  auto problems = [&](int L) {
    std::string all;
    for (const auto& p : layers[size_t(L)].find("problems")->items()) all += p.as_string() + "\n";
    return all;
  };
  for (const char* want : {"layers.1.ffn.shared_experts.w3.scale", "scale byte 1 (tile 0, 1) is NaN (0xff)"})
    EXPECT_NE(problems(1).find(want), std::string::npos) << want << "\n" << problems(1);
  for (const char* want : {"missing tensor \"layers.2.ffn.experts.2.w3.weight\"",
                           "layers.2.ffn.experts.4.w1.weight_scale_2\": global scale is -1"})
    EXPECT_NE(problems(2).find(want), std::string::npos) << want << "\n" << problems(2);
  EXPECT_NE(problems(0).find("hash-routed per the config but has no \"layers.0.ffn.gate.tid2eid\""), std::string::npos)
      << problems(0);
  for (int L = 0; L < 3; ++L) EXPECT_FALSE(layers[size_t(L)].find("loadable")->as_bool()) << L;
  const test::ToolRun t = test::run_tool("inspect --summary " + a);
  EXPECT_NE(t.out.find("    MALFORMED: tensor \"layers.1.ffn.shared_experts.w3.scale\""), std::string::npos) << t.out;
}

}  // namespace
}  // namespace nvfp4moe
