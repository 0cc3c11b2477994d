// MXFP4 routed experts from checkpoints: the fixture's MTP block (DeepSeek
// layout, the official MXFP4 tensors) loads byte for byte, runs on the CPU in
// DeepSeek's fp8 mode by default and in bf16 on request, close to the FP64
// evaluation, and through `nvfp4moe run --mtp [--act]`; a Hugging Face layer
// whose experts are MXFP4 loads too; inspect calls such blocks loadable, and
// `inspect --fp8-exact` counts the experts whose rows are E4M3 values times a
// power of two as the reference check does.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "common/json.hpp"
#include "nvfp4moe/format.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/moe_reference_f64.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::FixtureModel;

// The MTP block as the fixture wrote it: its router and shared expert, and
// the MXFP4 experts in the ExpertWeights layout (gate rows, up rows; down).
MoeWeights fixture_mtp(const FixtureModel& m) {
  MoeWeights w = m.mtp;
  ExpertWeights& ex = w.experts;
  ex.format = ExpertFormat::Mxfp4;
  ex.count = m.config.experts;
  ex.hidden = m.config.hidden;
  ex.intermediate = m.config.intermediate;
  for (const auto& e : m.mtp_experts) {
    for (int p : {0, 1}) {
      ex.w13_codes.insert(ex.w13_codes.end(), e[size_t(p)].codes.begin(), e[size_t(p)].codes.end());
      ex.w13_scales.insert(ex.w13_scales.end(), e[size_t(p)].scales.begin(), e[size_t(p)].scales.end());
    }
    ex.w2_codes.insert(ex.w2_codes.end(), e[2].codes.begin(), e[2].codes.end());
    ex.w2_scales.insert(ex.w2_scales.end(), e[2].scales.begin(), e[2].scales.end());
  }
  return w;
}

using Mxfp4Mtp = test::ModelDirsTest;

TEST_F(Mxfp4Mtp, LoadsByteForByteAndRunsInEveryMode) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const ModelDir da(a());
  const MoeWeights got = load_moe_layer(da, 0, LoadOptions{.mtp = true});
  const MoeWeights want = fixture_mtp(model_);
  EXPECT_EQ(got.experts.format, ExpertFormat::Mxfp4);
  EXPECT_EQ(got.config.activation, ActivationMode::Fp8);  // DeepSeek's own for FP4 experts
  EXPECT_TRUE(got.experts.w13_codes == want.experts.w13_codes) << "w13_codes";
  EXPECT_TRUE(got.experts.w13_scales == want.experts.w13_scales) << "w13_scales";
  EXPECT_TRUE(got.experts.w2_codes == want.experts.w2_codes) << "w2_codes";
  EXPECT_TRUE(got.experts.w2_scales == want.experts.w2_scales) << "w2_scales";
  EXPECT_TRUE(got.experts.w13_global.empty() && got.experts.w2_global.empty());
  EXPECT_FALSE(got.config.hash_routed);
  EXPECT_TRUE(got.router.gate == want.router.gate);
  EXPECT_EQ(got.router.bias, want.router.bias);
  EXPECT_EQ(got.shared.w2_fp8, want.shared.w2_fp8);

  test::Rng rng(seed_);
  const int64_t T = 24, H = model_.config.hidden;
  const std::vector<float> x = test::random_normal(rng, T * H);
  for (ActivationMode mode : {ActivationMode::Fp8, ActivationMode::Bf16, ActivationMode::Nvfp4}) {
    SCOPED_TRACE(activation_mode_name(mode));
    MoeWeights w = load_moe_layer(da, 0, LoadOptions{.mtp = true, .activation = mode});
    ASSERT_EQ(w.config.activation, mode);
    Moe moe(w, MoeOptions{});
    const HostResult r = moe.forward_host(HostBatch{x, T});
    MoeWeights ref_w = want;
    ref_w.config = w.config;
    const std::vector<double> ref = test::reference_moe_f64(ref_w, x, T, r.topk_ids, r.topk_weights);
    EXPECT_LT(test::rel_l2(r.y, ref), 1e-2);
  }
  // No input_scale to make static.
  EXPECT_ERROR_CONTAINS(load_moe_layer(da, 0, LoadOptions{.static_l1_input = true, .mtp = true}),
                        "static input scales requested", "mtp.0 (MTP block 0) has MXFP4 routed experts");
  // A NaN scale byte is named by tensor, row and block.
  std::vector<uint8_t> s = model_.mtp_experts[3][2].scales;
  s[5 * 5 + 2] = 0xFF;  // down: [256, 160/32 = 5]
  test::replace_in_model(a(), "mtp.0.ffn.experts.3.w2.scale", DType::F8E8M0, {256, 5}, s);
  EXPECT_ERROR_CONTAINS(load_moe_layer(ModelDir(a()), 0, LoadOptions{.mtp = true}),
                        "tensor \"mtp.0.ffn.experts.3.w2.scale\"", "row 5, block 2", "NaN byte 0xff");
}

TEST_F(Mxfp4Mtp, RunMtpFromTheCommandLine) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  test::Rng rng(seed_ + 1);
  const int64_t T = 6, H = model_.config.hidden;
  const std::vector<float> x = test::random_normal(rng, T * H);
  SafetensorsWriter in;
  in.add("hidden_states", DType::F32, {T, H}, x.data());
  in.write(dir_ / "x.safetensors");
  for (const char* act : {"", "fp8", "bf16"}) {
    SCOPED_TRACE(std::string("--act ") + act);
    const std::string opt = *act ? std::string(" --act ") + act : "";
    const test::ToolRun r = test::run_tool("run --model " + a() + " --layer 0 --mtp" + opt + " --input " +
                                           (dir_ / "x.safetensors") + " --output " + (dir_ / "y.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    LoadOptions lo{.mtp = true};
    if (*act) lo.activation = parse_activation_mode(act);
    Moe moe(load_moe_layer(ModelDir(a()), 0, lo), MoeOptions{});
    EXPECT_EQ(SafetensorsFile(dir_ / "y.safetensors").get("output").to_f32(), moe.forward_host(HostBatch{x, T}).y);
  }
  const test::ToolRun bad = test::run_tool("run --model " + a() + " --layer 0 --mtp --act int4 --input " +
                                           (dir_ / "x.safetensors") + " --output " + (dir_ / "y.safetensors"));
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--act: 'int4' is not one of nvfp4, bf16, fp8"), std::string::npos) << bad.err;
}

TEST_F(Mxfp4Mtp, HuggingFaceLayerWithMxfp4ExpertsLoads) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // Layer 1 of the Hugging Face layout, its experts swapped for the MTP
  // block's MXFP4 tensors under transformers' names.
  const char* proj[] = {"gate_proj", "up_proj", "down_proj"};
  for (int64_t e = 0; e < model_.config.experts; ++e)
    for (int p = 0; p < 3; ++p) {
      const std::string prefix = "model.layers.1.mlp.experts." + std::to_string(e) + "." + proj[p];
      const int64_t N = p == 2 ? 256 : 160, K = p == 2 ? 160 : 256;
      for (const char* suffix : {".weight_scale", ".weight_scale_2", ".input_scale"})
        test::replace_in_model(b(), prefix + suffix, DType::U8, {}, {});
      const auto& m = model_.mtp_experts[size_t(e)][size_t(p)];
      test::replace_in_model(b(), prefix + ".weight", DType::U8, {N, K / 2}, m.codes);
      test::replace_in_model(b(), prefix + ".scale", DType::F8E8M0, {N, K / 32}, m.scales);
    }
  const MoeWeights got = load_moe_layer(ModelDir(b()), 1);
  const MoeWeights want = fixture_mtp(model_);
  EXPECT_EQ(got.experts.format, ExpertFormat::Mxfp4);
  EXPECT_TRUE(got.experts.w13_codes == want.experts.w13_codes);
  EXPECT_TRUE(got.experts.w2_scales == want.experts.w2_scales);
  // inspect: an MXFP4 layer; this directory's plain NVFP4 manifest claims
  // every layer, which inspect reports (the loader goes by the tensors).
  for (const MoeLayerSummary& s : summarize_moe_layers(ModelDir(b())))
    if (s.index == 1) {
      EXPECT_EQ(s.routed_format, "MXFP4");
      ASSERT_EQ(s.problems.size(), 1u);
      EXPECT_EQ(s.problems[0], "the quantization manifest gives model.layers.1.mlp.experts NVFP4 but its experts are MXFP4");
    }
  // The fixture's DeepSeek MTP block (excluded from the manifest) is loadable.
  for (const MoeLayerSummary& s : summarize_moe_layers(ModelDir(a()))) {
    if (s.mtp) {
      EXPECT_TRUE(s.loadable && s.routed_format == "MXFP4") << s.block;
    }
  }
  // A scale of the wrong shape is reported, not thrown.
  test::replace_in_model(b(), "model.layers.1.mlp.experts.2.down_proj.scale", DType::F8E8M0, {256, 10},
                         std::vector<uint8_t>(2560, 127));
  for (const MoeLayerSummary& s : summarize_moe_layers(ModelDir(b())))
    if (s.index == 1) {
      EXPECT_FALSE(s.loadable);
      ASSERT_FALSE(s.problems.empty());
      EXPECT_NE(s.problems[0].find("down_proj.scale\": shape [256, 10], expected [256, 5]"), std::string::npos)
          << s.problems[0];
    }
}

// Experts of a loaded layer whose two projections pass the reference check
// (unit_g: with NVFP4's global scales taken as 1, the FP8 prefill form's condition).
int64_t reference_exact_experts(const ExpertWeights& x, bool unit_g = false) {
  const int block = int(x.scale_block());
  const int64_t H = x.hidden, I = x.intermediate;
  int64_t n = 0;
  for (int64_t e = 0; e < x.count; ++e) {
    std::vector<float> g13(size_t(2 * I), 1.0f), g2(size_t(H), 1.0f);
    if (x.format == ExpertFormat::Nvfp4 && !unit_g) {
      for (int64_t r = 0; r < 2 * I; ++r) g13[size_t(r)] = x.w13_global[size_t(2 * e + (r >= I ? 1 : 0))];
      for (auto& v : g2) v = x.w2_global[size_t(e)];
    }
    const bool w13 = e4m3_row_shifts_ref(x.w13_codes.data() + e * 2 * I * (H / 2),
                                         x.w13_scales.data() + e * 2 * I * (H / block), block, g13.data(), 1, 2 * I, H)
                         .exact;
    const bool w2 = e4m3_row_shifts_ref(x.w2_codes.data() + e * H * (I / 2), x.w2_scales.data() + e * H * (I / block),
                                        block, g2.data(), 1, H, I)
                        .exact;
    n += w13 && w2;
  }
  return n;
}

TEST_F(Mxfp4Mtp, InspectFp8ExactCountsExpertsAsTheReferenceDoes) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // MTP expert 0 with every scale 2^0: exact whatever its codes; expert 1
  // with one row spanning 2^-30 .. 2^20: not.
  for (const char* p : {"w1", "w3", "w2"}) {
    const bool down = std::string(p) == "w2";
    const int64_t rows = down ? 256 : 160, blocks = down ? 5 : 8;
    test::replace_in_model(a(), std::string("mtp.0.ffn.experts.0.") + p + ".scale", DType::F8E8M0, {rows, blocks},
                           std::vector<uint8_t>(size_t(rows * blocks), 127));
  }
  std::vector<uint8_t> s1(size_t(256 * 5), 127);
  s1[0] = 127 + 20;
  s1[1] = 127 - 30;
  test::replace_in_model(a(), "mtp.0.ffn.experts.1.w2.scale", DType::F8E8M0, {256, 5}, s1);
  std::vector<uint8_t> c1 = model_.mtp_experts[1][2].codes;  // [256, 80]: nonzero codes in row 0's blocks 0 and 1
  c1[0] = 0x22;
  c1[16] = 0x22;
  test::replace_in_model(a(), "mtp.0.ffn.experts.1.w2.weight", DType::I8, {256, 80}, c1);

  const test::ToolRun r = test::run_tool("inspect " + a() + " --summary --json --fp8-exact");
  ASSERT_EQ(r.code, 0) << r.err;
  const json::Value v = json::parse(r.out);
  ASSERT_NE(v.find("fp8_exact"), nullptr) << r.out;
  const ModelDir d(a());
  int checked = 0;
  for (const MoeLayerSummary& s : summarize_moe_layers(d)) {
    if (!s.loadable) continue;
    const MoeWeights w = load_moe_layer(d, s.index, LoadOptions{.mtp = s.mtp});
    const json::Value* entry = nullptr;
    for (const json::Value& e : v.find("fp8_exact")->items())
      if (e.find("block")->as_string() == s.block) entry = &e;
    ASSERT_NE(entry, nullptr) << s.block;
    const int64_t want = reference_exact_experts(w.experts);
    EXPECT_EQ(entry->find("experts")->as_int(), w.experts.count) << s.block;
    EXPECT_EQ(entry->find("exact_experts")->as_int(), want) << s.block;
    EXPECT_EQ(entry->find("fp8_prefill_experts")->as_int(), reference_exact_experts(w.experts, true)) << s.block;
    if (s.mtp) {
      EXPECT_GE(want, 1);  // expert 0
      EXPECT_LT(want, w.experts.count);  // expert 1
      EXPECT_NE(entry->find("first_inexact")->as_string().find("binades"), std::string::npos);
    } else {
      // NVFP4 experts quantized from random weights: block scales that are not powers of two.
      EXPECT_EQ(want, 0) << s.block;
      EXPECT_NE(entry->find("first_inexact")->as_string().find("not a power of two"), std::string::npos);
    }
    ++checked;
  }
  EXPECT_GE(checked, 3);
  // The text form names the MTP block's count.
  const test::ToolRun t = test::run_tool("inspect " + a() + " --summary --fp8-exact");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("an FP8 tensor-core path's condition"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("FP8 prefill form (run --fp8-mma"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("mtp.0"), std::string::npos);
}

}  // namespace
}  // namespace nvfp4moe
