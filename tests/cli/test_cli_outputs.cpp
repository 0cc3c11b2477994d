// Output paths of the tool: special files refused and kept, symlinks
// written through, an output that is one of the inputs refused (by file
// identity: a symlink or hard link to the input counts), and the wrong kind
// of output for the input (a file name where a directory is written, a file
// where a directory is expected) refused before anything is created.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::read_bytes;
using test::ScratchDir;
using test::is_link;
using test::is_fifo;

struct ToolResult {
  int code = -1;
  std::string err;
};

ToolResult run_tool(const std::string& args, const ScratchDir& logs) {
  // </dev/null: a FIFO opened by mistake would block, the timeout ends it.
  const std::string cmd = "timeout 20 " + std::string(NVFP4MOE_CLI_PATH) + " " + args + " </dev/null >/dev/null 2>" +
                          (logs / "err.log");
  const int status = std::system(cmd.c_str());
  const std::vector<uint8_t> b = read_bytes(logs / "err.log");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(b.begin(), b.end())};
}

std::string text(const std::string& p) {
  const std::vector<uint8_t> b = read_bytes(p);
  return std::string(b.begin(), b.end());
}


void write_input(const std::string& path) {
  const std::vector<float> x(16 * 32, 0.5f);
  SafetensorsWriter w;
  w.add("model.layers.0.mlp.experts.0.up_proj.weight", DType::F32, {16, 32}, x.data());
  w.write(path);
}

void expect_message(const ToolResult& r, const std::string& want) {
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find(want), std::string::npos) << r.err << " lacks: " << want;
}

TEST(CliOutputs, SpecialFilesAreRefusedForEveryCommand) {
  ScratchDir d;
  write_input(d / "in.safetensors");
  ASSERT_EQ(run_tool("quantize --in " + (d / "in.safetensors") + " --out " + (d / "q.safetensors"), d).code, 0);
  ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
  std::filesystem::create_symlink("/dev/null", d / "null");
  for (const std::string& out : {d / "fifo", d / "null"}) {
    SCOPED_TRACE(out);
    const std::string kind = out == d / "fifo" ? "is a FIFO" : "(a symlink to /dev/null) is a character device";
    expect_message(run_tool("quantize --in " + (d / "in.safetensors") + " --out " + out, d), kind);
    expect_message(run_tool("dequantize --in " + (d / "q.safetensors") + " --out " + out, d), kind);
    // run refuses its output before reading the model or the input.
    expect_message(run_tool("run --model " + d.path() + " --layer 0 --input " + (d / "in.safetensors") +
                                " --output " + out, d),
                   kind);
  }
  EXPECT_TRUE(is_fifo(d / "fifo"));
  EXPECT_TRUE(is_link(d / "null"));
}

TEST(CliOutputs, SymlinkOutputIsWrittenThrough) {
  ScratchDir d;
  write_input(d / "in.safetensors");
  test::write_text(d / "target.safetensors", "old");
  std::filesystem::create_symlink("target.safetensors", d / "link.safetensors");
  const ToolResult r = run_tool("quantize --in " + (d / "in.safetensors") + " --out " + (d / "link.safetensors"), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(is_link(d / "link.safetensors"));
  EXPECT_EQ(SafetensorsFile(d / "target.safetensors").tensors().size(), 3u);
}

TEST(CliOutputs, OutputThatIsAnInputIsRefused) {
  ScratchDir d;
  write_input(d / "in.safetensors");
  const std::vector<uint8_t> before = read_bytes(d / "in.safetensors");
  std::filesystem::create_symlink("in.safetensors", d / "soft.safetensors");
  std::filesystem::create_hard_link(d / "in.safetensors", d / "hard.safetensors");
  for (const char* out : {"in.safetensors", "soft.safetensors", "hard.safetensors"}) {
    SCOPED_TRACE(out);
    expect_message(run_tool("quantize --in " + (d / "in.safetensors") + " --out " + (d / out), d),
                   "is the same file as --in " + (d / "in.safetensors"));
    expect_message(run_tool("run --model " + (d / "model") + " --layer 0 --input " + (d / "in.safetensors") +
                                " --output " + (d / out), d),
                   "is the same file as --input " + (d / "in.safetensors"));
  }
  // run --output inside the model directory, under another name.
  std::filesystem::create_directory(d / "model");
  write_input(d / "model/model.safetensors");
  std::filesystem::create_symlink("model/model.safetensors", d / "y.safetensors");
  expect_message(run_tool("run --model " + (d / "model") + " --layer 0 --input " + (d / "in.safetensors") +
                              " --output " + (d / "y.safetensors"), d),
                 "of --model " + (d / "model"));
  EXPECT_EQ(read_bytes(d / "in.safetensors"), before);
}

TEST(CliOutputs, DirectoryOutputsOfTheWrongKindAreRefused) {
  ScratchDir d;
  std::filesystem::create_directory(d / "in");
  write_input(d / "in/model.safetensors");
  // A file name where a directory is written: nothing is created.
  expect_message(run_tool("quantize --in " + (d / "in") + " --out " + (d / "f.safetensors"), d),
                 "the name ends in .safetensors; give a directory name");
  EXPECT_FALSE(std::filesystem::exists(d / "f.safetensors"));
  // A file where a directory is expected, and a directory where a file is.
  write_input(d / "file.safetensors");
  expect_message(run_tool("quantize --in " + (d / "in") + " --out " + (d / "file.safetensors"), d),
                 "is a regular file but --in " + (d / "in") + " is a model directory");
  expect_message(run_tool("quantize --in " + (d / "file.safetensors") + " --out " + (d / "in"), d),
                 "is a directory but --in " + (d / "file.safetensors") + " is a file");
  expect_message(run_tool("run --model " + (d / "in") + " --layer 0 --input " + (d / "file.safetensors") +
                              " --output " + (d / "in"), d),
                 "is a directory, not a regular file");
  // A symlink to the input directory, and a directory reached through a symlink.
  std::filesystem::create_directory_symlink("in", d / "in_link");
  expect_message(run_tool("quantize --in " + (d / "in") + " --out " + (d / "in_link"), d),
                 "are the same directory");
  std::filesystem::create_directory(d / "real_out");
  std::filesystem::create_directory_symlink("real_out", d / "out_link");
  const ToolResult r = run_tool("quantize --in " + (d / "in") + " --out " + (d / "out_link"), d);
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(is_link(d / "out_link"));
  EXPECT_EQ(SafetensorsFile(d / "real_out/model.safetensors").tensors().size(), 3u);
}

TEST(CliOutputs, DirectoryOutputIsCheckedWholeBeforeAnyFileMoves) {
  ScratchDir d;
  std::filesystem::create_directory(d / "in");
  write_input(d / "in/model.safetensors");
  test::write_text(d / "in/config.json", R"({"hidden_size": 32})");
  // The old output: its config.json must survive a refusal of model.safetensors.
  std::filesystem::create_directory(d / "out");
  test::write_text(d / "out/config.json", "old config");
  ASSERT_EQ(::mkfifo((d / "out/model.safetensors").c_str(), 0600), 0);
  expect_message(run_tool("quantize --in " + (d / "in") + " --out " + (d / "out"), d),
                 (d / "out/model.safetensors") + " is a FIFO, not a regular file");
  EXPECT_TRUE(is_fifo(d / "out/model.safetensors"));
  EXPECT_EQ(text(d / "out/config.json"), "old config");
  // An output file that is a symlink to the input's own shard.
  std::filesystem::remove(d / "out/model.safetensors");
  std::filesystem::create_symlink(d / "in/model.safetensors", d / "out/model.safetensors");
  const std::vector<uint8_t> shard = read_bytes(d / "in/model.safetensors");
  expect_message(run_tool("quantize --in " + (d / "in") + " --out " + (d / "out"), d),
                 "is the file " + (d / "in/model.safetensors") + " of --in");
  EXPECT_EQ(read_bytes(d / "in/model.safetensors"), shard);
  EXPECT_EQ(text(d / "out/config.json"), "old config");
  // No staging directory left behind.
  int entries = 0;
  for (const auto& e : std::filesystem::directory_iterator(d.path())) entries += e.is_directory();
  EXPECT_EQ(entries, 2);
}

}  // namespace
}  // namespace nvfp4moe
