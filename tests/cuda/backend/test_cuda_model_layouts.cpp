// Both checkpoint layouts on the cuda backend: every main layer of a
// DeepSeek-layout model directory (hash layer, FP8 shared experts with
// F8_E8M0 tile scales, sharded) and of its Hugging Face twin runs on the GPU
// to identical outputs, within the contract's tolerance of the FP64
// evaluation, with the CPU backend's routing, and so does the MXFP4 MTP
// block; `nvfp4moe run --device cuda` writes the same outputs as the
// in-process forward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/model_fixture.hpp"
#include "cuda_moe_harness.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/moe_reference_f64.hpp"

namespace nvfp4moe {
namespace {

using test::FixtureModel;

using CudaModelLayouts = test::ModelDirsTest;

Moe cuda_layer(const std::string& dir, int layer, int64_t max_tokens) {
  MoeOptions o;
  o.backend = Backend::Cuda;
  o.max_tokens = max_tokens;
  return Moe(load_moe_layer(ModelDir(dir), layer), o);
}

std::vector<float> output_of(const std::string& path) { return SafetensorsFile(path).get("output").to_f32(); }

TEST_F(CudaModelLayouts, BothLayoutsRunToIdenticalOutputsOnTheGpu) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE("seed " + std::to_string(seed_));
  test::Rng rng(seed_ ^ 0xc0da);
  const int64_t H = model_.config.hidden;
  for (const int64_t T : {int64_t(5), int64_t(300)}) {  // decode and prefill kernels
    SCOPED_TRACE("T " + std::to_string(T));
    const std::vector<float> x = test::random_normal(rng, T * H);
    std::vector<int32_t> tokens;
    for (int64_t t = 0; t < T; ++t) tokens.push_back(int32_t(rng.below(FixtureModel::kVocab)));
    for (int L = 0; L < FixtureModel::kLayers; ++L) {
      SCOPED_TRACE("layer " + std::to_string(L));
      Moe ga = cuda_layer(a(), L, T), gb = cuda_layer(b(), L, T);
      Moe cpu(load_moe_layer(ModelDir(a()), L), MoeOptions{});
      HostBatch batch{x, T};
      batch.token_ids = std::span<const int32_t>(tokens);
      const HostResult ra = ga.forward_host(batch), rb = gb.forward_host(batch), rc = cpu.forward_host(batch);
      EXPECT_EQ(ra.topk_ids, rb.topk_ids);
      EXPECT_EQ(ra.topk_ids, rc.topk_ids);
      ASSERT_EQ(ra.y.size(), size_t(T * H));
      ASSERT_EQ(ra.y.size(), rb.y.size());
      for (size_t i = 0; i < ra.y.size(); ++i) ASSERT_EQ(ra.y[i], rb.y[i]) << "element " << i;
      const std::vector<double> ref = test::reference_moe_f64(model_.layers[size_t(L)], x, T, rc.topk_ids, rc.topk_weights);
      EXPECT_LT(test::rel_l2(ra.y, ref), 1e-2);
      EXPECT_LT(test::rel_l2(ra.y, rc.y), 1e-2);
    }
    // The MXFP4 MTP block (in DeepSeek's fp8 mode, its default) with the CPU's routing.
    SCOPED_TRACE("MTP block 0");
    MoeOptions o;
    o.backend = Backend::Cuda;
    o.max_tokens = T;
    Moe gm(load_moe_layer(ModelDir(a()), 0, LoadOptions{.mtp = true}), o);
    Moe cm(load_moe_layer(ModelDir(a()), 0, LoadOptions{.mtp = true}), MoeOptions{});
    EXPECT_EQ(gm.config().activation, ActivationMode::Fp8);
    const HostResult rg = gm.forward_host(HostBatch{x, T}), rc = cm.forward_host(HostBatch{x, T});
    EXPECT_EQ(rg.topk_ids, rc.topk_ids);
    EXPECT_LT(test::rel_l2(rg.y, rc.y), 1e-2);
  }
}

TEST_F(CudaModelLayouts, RunWritesTheInProcessOutputOfEitherLayout) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t T = 7;
  const test::RunInput in = test::write_run_input(seed_ ^ 0x7a11, T, model_.config.hidden, dir_ / "x.safetensors");
  const std::vector<float>& x = in.x;
  const std::vector<int32_t>& tokens = in.tokens;
  for (int L : {0, 1}) {
    SCOPED_TRACE("layer " + std::to_string(L));
    const std::string args = " --device cuda --layer " + std::to_string(L) + " --input " + (dir_ / "x.safetensors") +
                             " --output ";
    test::ToolRun r = test::run_tool("run --model " + a() + args + (dir_ / "ya.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    r = test::run_tool("run --model " + b() + args + (dir_ / "yb.safetensors"));
    ASSERT_EQ(r.code, 0) << r.err;
    Moe moe = cuda_layer(a(), L, T);
    HostBatch batch{x, T};
    batch.token_ids = std::span<const int32_t>(tokens);
    const std::vector<float> want = moe.forward_host(batch).y;
    EXPECT_EQ(output_of(dir_ / "ya.safetensors"), want);
    EXPECT_EQ(output_of(dir_ / "yb.safetensors"), want);
  }
}

}  // namespace
}  // namespace nvfp4moe
