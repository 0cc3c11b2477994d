// The tool on tensor names crafted to break parsers: digit runs of tens or
// hundreds of thousands of characters and very long names. Each command
// either answers correctly or exits 1 with a message naming the tensor;
// none may crash (std::regex and recursive parsers overflowed the stack).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::ScratchDir;

struct ToolResult {
  int code = -1;  // -1: killed by a signal
  std::string err;
};

ToolResult run_tool(const std::string& args, const ScratchDir& dir) {
  const std::string cmd = std::string(NVFP4MOE_CLI_PATH) + " " + args + " >/dev/null 2>" + (dir / "err");
  const int status = std::system(cmd.c_str());
  const std::vector<uint8_t> b = test::read_bytes(dir / "err");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(b.begin(), b.end())};
}

void write_one(const std::string& path, const std::string& name) {
  const std::vector<float> x(16 * 32, 0.25f);
  SafetensorsWriter w;
  w.add(name, DType::F32, {16, 32}, x.data());
  w.write(path);
}

TEST(CliNames, InspectRefusesIndicesThatDoNotFitNamingTheTensor) {
  ScratchDir d;
  write_one(d / "a.safetensors", "model.layers.99999999999999999999.mlp.gate.weight");
  ToolResult r = run_tool("inspect " + (d / "a.safetensors"), d);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("tensor name 'model.layers.99999999999999999999.mlp.gate.weight': layer index: "
                       "99999999999999999999 is out of range [0, 2147483647]"),
            std::string::npos)
      << r.err;
  write_one(d / "b.safetensors", "model.layers." + std::string(30000, '7') + ".mlp.experts.0.up_proj.weight");
  r = run_tool("inspect " + (d / "b.safetensors"), d);
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("(30000 characters) is out of range"), std::string::npos) << r.err;
  EXPECT_LT(r.err.size(), 400u) << "the message repeats the whole name";
}

TEST(CliNames, QuantizeMatchesHugeNamesInLinearTime) {
  ScratchDir d;
  // The default --include on an expert index of 300,000 digits: it matches.
  const std::string prefix = "model.layers.1.mlp.experts." + std::string(300000, '3') + ".up_proj";
  write_one(d / "in.safetensors", prefix + ".weight");
  ToolResult r = run_tool("quantize --in " + (d / "in.safetensors") + " --out " + (d / "out.safetensors"), d);
  ASSERT_EQ(r.code, 0) << r.err;
  {
    const SafetensorsFile f(d / "out.safetensors");
    EXPECT_EQ(f.get(prefix + ".weight").dtype, DType::U8);
    EXPECT_EQ(f.get(prefix + ".weight_scale").shape, (std::vector<int64_t>{16, 2}));
    EXPECT_NE(f.find(prefix + ".weight_scale_2"), nullptr);
  }
  // A user pattern over a 50,000-character name, matched and not matched.
  const std::string long_name = std::string(50000, 'a') + ".weight";
  write_one(d / "in2.safetensors", long_name);
  r = run_tool("quantize --include '.*weight$' --in " + (d / "in2.safetensors") + " --out " + (d / "out2.safetensors"), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(SafetensorsFile(d / "out2.safetensors").tensors().size(), 3u);
  r = run_tool("quantize --include '^(a|aa)*b' --in " + (d / "in2.safetensors") + " --out " + (d / "out3.safetensors"), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(SafetensorsFile(d / "out3.safetensors").get(long_name).dtype, DType::F32);  // copied unchanged
}

}  // namespace
}  // namespace nvfp4moe
