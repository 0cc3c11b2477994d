// Without a GPU, the commands' CUDA paths are refused with a message naming
// the option, before any output: `convert --device cuda` and `run --ep R
// --device cuda` (which on a machine with GPUs runs R rank processes, or
// the R ranks emulated on one GPU).
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/model_fixture.hpp"
#include "checkpoint/mxfp4_release.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

#define SKIP_WITH_GPU() \
  if (::nvfp4moe::cuda_available()) GTEST_SKIP() << "a CUDA device is present"

std::string q(const std::string& p) { return "'" + p + "'"; }

// Either build: with CUDA but no device, or without the CUDA backend.
bool says_no_gpu(const std::string& err) {
  return err.find("no CUDA device is available") != std::string::npos ||
         err.find("has no CUDA backend") != std::string::npos;
}

TEST(CliNoGpu, ConvertOnCudaIsRefusedBeforeAnyOutput) {
  SKIP_WITH_GPU();
  test::Rng rng(test::fresh_seed());
  test::ScratchDir d;
  write_mxfp4_release(test::make_mxfp4_release(rng, 4), d / "in");
  const test::ToolRun r = test::run_tool("convert --to nvfp4 --device cuda " + q(d / "in") + " " + q(d / "out"));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  EXPECT_TRUE(says_no_gpu(r.err)) << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "out"));
}

// Every --format x --act of `bench`, and each --model, passes its option
// checks and stops at the device, writing no CSV.
TEST(CliNoGpu, BenchTakesEveryFormatModeAndModelUpToTheDevice) {
  SKIP_WITH_GPU();
  test::ScratchDir d;
  auto stops_at_device = [&](const std::string& args) {
    const test::ToolRun r = test::run_tool(args + " --csv " + q(d / "b.csv"));
    EXPECT_EQ(r.code, 1) << args;
    // With CUDA built but no device, or without the CUDA backend.
    EXPECT_TRUE(r.err.find("bench needs a CUDA device; none is available") != std::string::npos ||
                r.err.find("bench needs the cuda backend; this build has none") != std::string::npos)
        << args << ": " << r.err;
    EXPECT_FALSE(std::filesystem::exists(d / "b.csv")) << args;
  };
  for (const char* f : {"nvfp4", "mxfp4"})
    for (const char* a : {"nvfp4", "bf16", "fp8"})
      stops_at_device(std::string("bench --workload ep8 --tokens 1 --format ") + f + " --act=" + a);
  for (const char* model : {"dsv4-pro", "dsv4-flash"})
    stops_at_device(std::string("bench --workload both --tokens 1 --model ") + model);
  stops_at_device("bench --workload ep8 --tokens 1 --graph");
}

TEST(CliNoGpu, RunEpOnCudaSaysThereIsNoGpu) {
  SKIP_WITH_GPU();
  const uint64_t seed = test::fresh_seed();
  test::ScratchDir d;
  const test::FixtureModel m = test::make_fixture_model(seed);
  write_deepseek_layout(m, d / "model");
  const int64_t T = 3, H = m.config.hidden;
  test::Rng rng(seed);
  const std::vector<float> x = test::random_normal(rng, T * H);
  SafetensorsWriter w;
  w.add("hidden_states", DType::F32, {T, H}, x.data());
  w.write(d / "x.safetensors");
  const test::ToolRun r = test::run_tool("run --ep 2 --device cuda --model " + q(d / "model") +
                                         " --layer 1 --input " + q(d / "x.safetensors") + " --output " +
                                         q(d / "y.safetensors"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(says_no_gpu(r.err)) << r.err;
  EXPECT_NE(r.err.find("--ep"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line: " << r.err;
  EXPECT_FALSE(std::filesystem::exists(d / "y.safetensors"));
}

}  // namespace
}  // namespace nvfp4moe
