// `nvfp4moe convert --to nvfp4` on a small MXFP4 release written by hand
// (official names, two shards, an index, configs, an inference/ folder):
// the experts come out as ModelOpt's quantize_to_nvfp4.py makes them (the
// bytes of the §2 quantizer on the exact BF16 values, one weight_scale_2
// for w1 and w3), everything else byte for byte, the index and the configs
// rewritten; --lossless keeps every in-range block exactly and reports the
// rest; input_scale only from calibration amaxes.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/convert.hpp"
#include "checkpoint/model_fixture.hpp"
#include "checkpoint/mxfp4_release.hpp"
#include "checkpoint/mxfp4_weights.hpp"
#include "common/json.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/format.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

constexpr int64_t kH = 128, kI = 64, kE = 2;

std::string read_text(const std::string& path) {
  const std::vector<uint8_t> b = test::read_bytes(path);
  return std::string(b.begin(), b.end());
}

using Release = test::Mxfp4Release;

Release make_release(test::Rng& rng, int spread) { return test::make_mxfp4_release(rng, spread, kH, kI, kE); }
void write_release(const Release& r, const std::string& dir) { test::write_mxfp4_release(r, dir); }

std::vector<float> nvfp4_values(const ModelDir& d, const std::string& path) {
  const TensorInfo& w = d.get(path + ".weight");
  std::vector<float> out(size_t(w.shape[0] * w.shape[1] * 2));
  const float g = d.get(path + ".weight_scale_2").to_f32()[0];
  dequantize_rows(w.data, d.get(path + ".weight_scale").data, &g, 0, w.shape[0], w.shape[1] * 2, out.data());
  return out;
}

TEST(Convert, ModelOptQuantizeToNvfp4Layout) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir d;
  const Release r = make_release(rng, 4);
  write_release(r, d / "in");
  std::vector<std::string> lines;
  std::vector<int64_t> done;  // weight_done's counts, and its totals and shards
  std::set<int64_t> totals;
  std::set<std::string> shards;
  ConvertOptions o;
  o.progress = [&](const std::string& l) { lines.push_back(l); };
  o.weight_done = [&](int64_t n, int64_t total, const std::string& shard) {
    done.push_back(n);
    totals.insert(total);
    shards.insert(shard);
  };
  const ConvertReport rep = convert_mxfp4_to_nvfp4(d / "in", d / "out", o);
  EXPECT_EQ(rep.experts_converted, 3 * kE);
  ASSERT_EQ(done.size(), size_t(3 * kE));  // once per expert weight, counting up to the total
  for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i], int64_t(i + 1));
  EXPECT_EQ(totals, std::set<int64_t>{3 * kE});
  EXPECT_EQ(shards, std::set<std::string>{"model-00001-of-00002.safetensors"});  // the second has no experts
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_NE(lines[0].find("convert: shard 1/2 model-00001-of-00002.safetensors: 6 expert weights to NVFP4"),
            std::string::npos) << lines[0];
  const ModelDir out(d / "out");
  for (int64_t e = 0; e < kE; ++e) {
    const std::string base = "layers.0.ffn.experts." + std::to_string(e) + ".";
    const Mxfp4Matrix &w1 = r.weights.at(base + "w1"), &w3 = r.weights.at(base + "w3");
    const float g13 = global_scale_for_amax(std::max(abs_max(dequantize(w1).data(), kI * kH),
                                                     abs_max(dequantize(w3).data(), kI * kH)));
    for (const char* p : {"w1", "w3", "w2"}) {
      SCOPED_TRACE(base + p);
      const Mxfp4Matrix& m = r.weights.at(base + p);
      const std::vector<float> x = dequantize(m);
      const float g = std::string(p) == "w2" ? global_scale_for_amax(abs_max(x.data(), m.rows * m.cols)) : g13;
      const Nvfp4Matrix want = quantize_matrix(x.data(), m.rows, m.cols, ScaleScope::Static, g);
      const TensorInfo& w = out.get(base + p + ".weight");
      EXPECT_EQ(w.dtype, DType::U8);
      EXPECT_EQ(w.shape, std::vector<int64_t>({m.rows, m.cols / 2}));
      EXPECT_BYTES_EQ(w.data, want.codes.data(), int64_t(want.codes.size()), "codes");
      EXPECT_BYTES_EQ(out.get(base + p + ".weight_scale").data, want.scales.data(), int64_t(want.scales.size()),
                      "scales");
      EXPECT_EQ(out.get(base + p + ".weight_scale").dtype, DType::F8E4M3);
      EXPECT_TRUE(out.get(base + p + ".weight_scale_2").shape.empty());
      EXPECT_EQ(out.get(base + p + ".weight_scale_2").to_f32()[0], g);
      EXPECT_FALSE(out.has(base + p + ".scale"));
      EXPECT_FALSE(out.has(base + p + ".input_scale"));  // no calibration amaxes
    }
  }
  // MTP experts and every other tensor: byte for byte.
  const ModelDir in(d / "in");
  for (const std::string& n : in.tensor_names())
    if (n.rfind("layers.0.ffn.", 0) != 0) {
      ASSERT_TRUE(out.has(n)) << n;
      const TensorInfo &a = in.get(n), &b = out.get(n);
      EXPECT_EQ(a.dtype, b.dtype) << n;
      EXPECT_EQ(a.shape, b.shape) << n;
      EXPECT_BYTES_EQ(b.data, a.data, int64_t(a.nbytes), n);
    }
  // Manifests as ModelOpt writes them; ancillary files carried over.
  const json::Value hq = json::parse(read_text(d / "out/hf_quant_config.json"));
  EXPECT_EQ(hq.find("producer")->find("name")->as_string(), "modelopt");
  const json::Value* q = hq.find("quantization");
  EXPECT_EQ(q->find("quant_algo")->as_string(), "MIXED_PRECISION");
  ASSERT_EQ(q->find("quantized_layers")->members().size(), 1u);
  EXPECT_EQ(q->find("quantized_layers")->members()[0].first, "layers.0.ffn.experts");
  EXPECT_EQ(q->find("exclude_modules")->items().back().as_string(), "mtp.*");
  const json::Value cfg = json::parse(read_text(d / "out/config.json"));
  const json::Value* qc = cfg.find("quantization_config");
  EXPECT_EQ(qc->find("quant_method")->as_string(), "fp8");
  EXPECT_EQ(qc->find("moe_quant_algo")->as_string(), "NVFP4");
  EXPECT_EQ(qc->find("fmt")->as_string(), "e4m3");  // the source's keys are kept
  EXPECT_EQ(qc->find("ignore")->items().size(), 4u);
  EXPECT_EQ(out.quant_manifest().algo_of("layers.0.ffn.experts"), "NVFP4");
  EXPECT_EQ(read_text(d / "out/inference/config.json"), R"({"dim": 128})");
  EXPECT_TRUE(std::filesystem::exists(d / "out/tokenizer.json"));
}

TEST(Convert, LosslessCastKeepsInRangeBlocksExactly) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir d;
  Release r = make_release(rng, 18);  // k spans 18 values: every block within E4M3's window
  // One block of expert 1's w2 far below the tensor's k_max: out of range.
  Mxfp4Matrix& w2 = r.weights.at("layers.0.ffn.experts.1.w2");
  w2.scales[7] = 90;
  write_release(r, d / "in");
  ConvertOptions o;
  o.lossless = true;
  o.include_mtp = true;
  const ConvertReport rep = convert_mxfp4_to_nvfp4(d / "in", d / "out", o);
  EXPECT_EQ(rep.experts_converted, 6 * kE);
  ASSERT_EQ(rep.inexact.size(), 1u);
  EXPECT_EQ(rep.inexact[0], "layers.0.ffn.experts.1.w2.weight: 2 of 512 blocks requantized");
  EXPECT_EQ(rep.blocks - rep.exact_blocks, 2);
  const ModelDir out(d / "out");
  for (const auto& [path, m] : r.weights) {
    SCOPED_TRACE(path);
    const std::vector<float> want = dequantize(m), got = nvfp4_values(out, path);
    int kmax = -127;
    for (uint8_t b : m.scales) kmax = std::max(kmax, int(b) - 127);
    const std::string sib = path.back() == '1' ? path.substr(0, path.size() - 1) + "3"
                            : path.back() == '3' ? path.substr(0, path.size() - 1) + "1" : "";
    if (!sib.empty())
      for (uint8_t b : r.weights.at(sib).scales) kmax = std::max(kmax, int(b) - 127);
    EXPECT_EQ(out.get(path + ".weight_scale_2").to_f32()[0], std::ldexp(1.0f, kmax - 8));
    for (size_t i = 0; i < want.size(); ++i) {
      if (path == "layers.0.ffn.experts.1.w2" && i / 32 == 7) continue;  // the requantized block
      ASSERT_EQ(got[i], want[i]) << "element " << i;
    }
    // In-range blocks keep their nibbles.
    if (path != "layers.0.ffn.experts.1.w2")
      EXPECT_BYTES_EQ(out.get(path + ".weight").data, m.codes.data(), int64_t(m.codes.size()), "codes");
  }
  EXPECT_EQ(json::parse(read_text(d / "out/hf_quant_config.json"))
                .find("quantization")->find("exclude_modules")->items().size(), 3u);  // no "mtp.*"
}

TEST(Convert, InputScalesFromCalibrationAmaxes) {
  test::Rng rng(11);
  ScratchDir d;
  write_release(make_release(rng, 4), d / "in");
  ConvertOptions o;
  o.amax = {{"layers.0.ffn.experts.0.w1_input_quantizer._amax", 6.0f},
            {"layers.0.ffn.experts.0.w3_input_quantizer._amax", 9.0f},
            {"layers.0.ffn.experts.0.w2_input_quantizer._amax", 3.0f},
            {"layers.0.ffn.experts.0.w2_weight_quantizer._amax", 2.0f}};
  convert_mxfp4_to_nvfp4(d / "in", d / "out", o);
  const ModelDir out(d / "out");
  auto scalar = [&](const std::string& n) { return out.get(n).to_f32()[0]; };
  EXPECT_EQ(scalar("layers.0.ffn.experts.0.w1.input_scale"), 9.0f / 2688.0f);  // w1 and w3 fused by max
  EXPECT_EQ(scalar("layers.0.ffn.experts.0.w3.input_scale"), 9.0f / 2688.0f);
  EXPECT_EQ(scalar("layers.0.ffn.experts.0.w2.input_scale"), 3.0f / 2688.0f);
  EXPECT_EQ(scalar("layers.0.ffn.experts.0.w2.weight_scale_2"), 2.0f / 2688.0f);  // the calibrated weight amax
  // Expert 1 was never calibrated: the max over the calibrated experts of its projection.
  EXPECT_EQ(scalar("layers.0.ffn.experts.1.w1.input_scale"), 9.0f / 2688.0f);
  EXPECT_EQ(scalar("layers.0.ffn.experts.1.w2.input_scale"), 3.0f / 2688.0f);
  // The result loads as an NVFP4 layer's experts would.
  EXPECT_EQ(out.get("layers.0.ffn.experts.1.w2.weight").dtype, DType::U8);
}

// The lossless cast keeps the values, and makes every block factor a power
// of two: rows that are E4M3 values times 2^r as MXFP4 stay so as NVFP4, with
// the same shifts; ModelOpt's amax quantization does not keep that.
TEST(Convert, LosslessCastKeepsRowsE4m3TimesAPowerOfTwo) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir d;
  const Release r = make_release(rng, 4);
  write_release(r, d / "in");
  ConvertOptions lossless;
  lossless.lossless = true;
  convert_mxfp4_to_nvfp4(d / "in", d / "lossless", lossless);
  convert_mxfp4_to_nvfp4(d / "in", d / "amax", ConvertOptions{});
  const ModelDir out(d / "lossless"), amax(d / "amax");
  auto nvfp4_shifts = [](const ModelDir& dir, const std::string& path, int64_t rows, int64_t cols) {
    const float g = dir.get(path + ".weight_scale_2").to_f32()[0];
    return e4m3_row_shifts(dir.get(path + ".weight").data, dir.get(path + ".weight_scale").data, 16, &g, 0, rows, cols);
  };
  int amax_inexact = 0;
  for (int64_t e = 0; e < kE; ++e)
    for (const char* p : {"w1", "w3", "w2"}) {
      const std::string path = "layers.0.ffn.experts." + std::to_string(e) + "." + p;
      SCOPED_TRACE(path);
      const Mxfp4Matrix& m = r.weights.at(path);
      const E4m3RowShifts want = e4m3_row_shifts(m.codes.data(), m.scales.data(), 32, nullptr, 0, m.rows, m.cols);
      ASSERT_TRUE(want.exact) << want.why;  // scale exponents within 4 binades
      const E4m3RowShifts got = nvfp4_shifts(out, path, m.rows, m.cols);
      ASSERT_TRUE(got.exact) << got.why;
      EXPECT_EQ(got.shift, want.shift);
      amax_inexact += !nvfp4_shifts(amax, path, m.rows, m.cols).exact;
    }
  EXPECT_GT(amax_inexact, 0);
}

// Several workers, each with its own numerics, write the same files as one;
// an error in one worker's job is reported once, naming its tensor.
TEST(Convert, WorkersWriteTheSameBytesAsOne) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir d;
  write_release(make_release(rng, 6), d / "in");
  for (const bool lossless : {false, true}) {
    const std::string one = d / (lossless ? "one-l" : "one"), three = d / (lossless ? "three-l" : "three");
    ConvertOptions a;
    a.lossless = lossless;
    convert_mxfp4_to_nvfp4(d / "in", one, a);
    ConvertOptions b = a;
    int made = 0;
    b.make_numerics = [&made] {
      ++made;
      return host_convert_numerics(1);
    };
    b.workers = 3;
    std::vector<int64_t> done;  // the workers' weight_done calls, one at a time
    b.weight_done = [&done](int64_t n, int64_t, const std::string&) { done.push_back(n); };
    const ConvertReport rep = convert_mxfp4_to_nvfp4(d / "in", three, b);
    EXPECT_EQ(made, 3);
    EXPECT_EQ(rep.experts_converted, 3 * kE);
    ASSERT_EQ(done.size(), size_t(3 * kE));
    for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i], int64_t(i + 1));
    for (const auto& f : std::filesystem::directory_iterator(one)) {
      if (!f.is_regular_file()) continue;
      const std::string name = f.path().filename().string();
      EXPECT_EQ(test::read_bytes(f.path().string()), test::read_bytes(three + "/" + name)) << name;
    }
  }
  ConvertOptions bad;
  bad.make_numerics = [] {
    ConvertNumerics n = host_convert_numerics(1);
    n.amax = [](const Mxfp4WeightView&) -> float { NVFP4_FAIL("numerics refused the weight"); };
    return n;
  };
  bad.workers = 2;
  EXPECT_ERROR_CONTAINS(convert_mxfp4_to_nvfp4(d / "in", d / "bad", bad), "numerics refused the weight");
}

TEST(Convert, CommandLineWritesProgressAndRefusesOtherTargets) {
  test::Rng rng(5);
  ScratchDir d;
  write_release(make_release(rng, 4), d / "in");
  test::ToolRun t = test::run_tool("convert --to nvfp4 " + (d / "in") + " " + (d / "out") + " --lossless");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.err.find("convert: shard 2/2"), std::string::npos) << t.err;
  EXPECT_NE(t.out.find("lossless cast: 3072 of 3072 NVFP4 blocks exact"), std::string::npos) << t.out;
  t = test::run_tool("convert --to mxfp8 " + (d / "in") + " " + (d / "out2"));
  EXPECT_NE(t.code, 0);
  EXPECT_NE(t.err.find("--to: 'mxfp8' is not one of nvfp4"), std::string::npos) << t.err;
}

}  // namespace
}  // namespace nvfp4moe
