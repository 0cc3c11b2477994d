// Without a GPU, the commands' CUDA paths are refused with a message naming
// the option, before any output: `convert --device cuda`.
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

}  // namespace
}  // namespace nvfp4moe
