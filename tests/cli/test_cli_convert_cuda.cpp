// `nvfp4moe convert --device cuda` writes the same files as the host, byte
// for byte (MXFP4 decode, amaxes, the shared w1 / w3 scale, NVFP4 codes and
// block scales, the lossless cast and its report come from the GPU), and
// refuses a NaN scale byte naming the tensor, leaving no output.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "checkpoint/mxfp4_release.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

#define SKIP_WITHOUT_GPU() \
  if (!::nvfp4moe::cuda_available()) GTEST_SKIP() << "no CUDA device"

std::string q(const std::string& p) { return "'" + p + "'"; }

// Rows of a geometry the fast staging kernel takes (more rows than SMs),
// with the scale bytes a release can hold at its edges: 0x00 (2^-127, an
// all-zero block in the release, here with codes), 0xfc (the largest
// finite), one block far below its tensor's k_max (requantized by the
// lossless cast), and a w3 whose k_max is above its w1's.
test::Mxfp4Release edge_release(test::Rng& rng) {
  test::Mxfp4Release r = test::make_mxfp4_release(rng, 18, 1024, 512, 2);
  Mxfp4Matrix& w1 = r.weights.at("layers.0.ffn.experts.0.w1");
  for (int i = 0; i < 40; ++i) w1.scales[size_t(rng.below(int64_t(w1.scales.size())))] = 0x00;
  r.weights.at("layers.0.ffn.experts.0.w3").scales[77] = 140;
  r.weights.at("layers.0.ffn.experts.1.w2").scales[5] = 0xfc;
  r.weights.at("layers.0.ffn.experts.1.w1").scales[3] = 90;
  return r;
}

void expect_same_outputs(const std::string& a, const std::string& b) {
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json", "config.json", "hf_quant_config.json",
                        "inference/config.json", "tokenizer.json"}) {
    const std::vector<uint8_t> x = test::read_bytes(a + "/" + f), y = test::read_bytes(b + "/" + f);
    EXPECT_FALSE(x.empty()) << f;
    EXPECT_EQ(x.size(), y.size()) << f;
    EXPECT_EQ(test::first_mismatch(x.data(), y.data(), int64_t(std::min(x.size(), y.size()))), -1) << f;
  }
}

TEST(CliConvertCuda, SameFilesAsTheHost) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  test::ScratchDir d;
  write_mxfp4_release(edge_release(rng), d / "in");
  for (const std::string mode : {"", " --lossless --include-mtp"}) {
    SCOPED_TRACE("mode '" + mode + "'");
    const std::string host_out = d / ("host" + std::to_string(mode.size())),
                      gpu_out = d / ("gpu" + std::to_string(mode.size()));
    const test::ToolRun host = test::run_tool("convert --to nvfp4 " + q(d / "in") + " " + q(host_out) + mode);
    ASSERT_EQ(host.code, 0) << host.err;
    const test::ToolRun gpu =
        test::run_tool("convert --to nvfp4 --device cuda " + q(d / "in") + " " + q(gpu_out) + mode);
    ASSERT_EQ(gpu.code, 0) << gpu.err;
    expect_same_outputs(host_out, gpu_out);
    // The report (lossless: exact blocks and the requantized tensors) with the output paths taken out.
    auto report = [](std::string s, const std::string& out) {
      for (size_t at; (at = s.find(out)) != std::string::npos;) s.replace(at, out.size(), "OUT");
      return s;
    };
    EXPECT_EQ(report(gpu.out, gpu_out), report(host.out, host_out));
    EXPECT_NE(gpu.err.find("convert: shard 2/2"), std::string::npos) << gpu.err;  // the same progress lines
  }
}

TEST(CliConvertCuda, NanScaleIsRefusedNamingTheTensor) {
  SKIP_WITHOUT_GPU();
  test::Rng rng(test::fresh_seed());
  test::ScratchDir d;
  test::Mxfp4Release r = test::make_mxfp4_release(rng, 4);
  r.weights.at("layers.0.ffn.experts.1.w2").scales[3] = 0xff;
  write_mxfp4_release(r, d / "in");
  const test::ToolRun t = test::run_tool("convert --to nvfp4 --device cuda " + q(d / "in") + " " + q(d / "out"));
  EXPECT_NE(t.code, 0);
  EXPECT_NE(t.err.find("layers.0.ffn.experts.1.w2"), std::string::npos) << t.err;
  EXPECT_NE(t.err.find("NaN"), std::string::npos) << t.err;
  EXPECT_FALSE(std::filesystem::exists(d / "out"));
}

}  // namespace
}  // namespace nvfp4moe
