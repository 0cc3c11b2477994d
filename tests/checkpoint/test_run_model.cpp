// `nvfp4moe run --layer L` on model directories of both layouts: a layer of
// the DeepSeek layout and its Hugging Face twin give the same output file as
// the in-process forward (on one rank and on emulated expert-parallel
// ranks), and the MXFP4 MTP block runs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::FixtureModel;
using test::ScratchDir;

std::vector<float> output_of(const std::string& path) { return SafetensorsFile(path).get("output").to_f32(); }

TEST(RunModel, EitherLayoutRunsALayerAndTheMxfp4MtpBlock) {
  const uint64_t seed = test::fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  test::Rng rng(seed);
  ScratchDir d;
  const FixtureModel model = test::make_fixture_model(seed);
  test::write_deepseek_layout(model, d / "a");
  test::write_huggingface_layout(model, d / "b");
  const int64_t T = 5;
  const test::RunInput in = test::write_run_input(rng.next(), T, model.config.hidden, d / "x.safetensors");
  const std::vector<float>& x = in.x;
  const std::vector<int32_t>& tokens = in.tokens;
  for (int L : {0, 2}) {
    SCOPED_TRACE("layer " + std::to_string(L));
    const std::string args = " --layer " + std::to_string(L) + " --input " + (d / "x.safetensors") + " --output ";
    test::ToolRun r = test::run_tool("run --model " + (d / "a") + args + (d / "ya.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    r = test::run_tool("run --model " + (d / "b") + args + (d / "yb.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    r = test::run_tool("run --model " + (d / "a") + " --ep 2" + args + (d / "ye.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    Moe moe(load_moe_layer(ModelDir(d / "a"), L), MoeOptions{});
    HostBatch batch{x, T};
    batch.token_ids = std::span<const int32_t>(tokens);
    const std::vector<float> want = moe.forward_host(batch).y;
    EXPECT_EQ(output_of(d / "ya.safetensors"), want);
    EXPECT_EQ(output_of(d / "yb.safetensors"), want);
    EXPECT_EQ(output_of(d / "ye.safetensors"), want);
  }
  // The MXFP4 MTP block runs too (in DeepSeek's fp8 mode, its default).
  const test::ToolRun r =
      test::run_tool("run --model " + (d / "a") + " --layer 0 --mtp --input " + (d / "x.safetensors") + " --output " +
                     (d / "ym.safetensors"));
  ASSERT_EQ(r.code, 0) << r.err;
  Moe mtp(load_moe_layer(ModelDir(d / "a"), 0, LoadOptions{.mtp = true}), MoeOptions{});
  EXPECT_EQ(output_of(d / "ym.safetensors"), mtp.forward_host(HostBatch{x, T}).y);
}

}  // namespace
}  // namespace nvfp4moe
