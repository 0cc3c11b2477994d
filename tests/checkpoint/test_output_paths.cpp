// Every writer of the library (write_file_atomic, SafetensorsWriter::write,
// save_moe_layer) applies the output rules of checkpoint/file_util.hpp: a
// path that is a FIFO, a device or a directory is refused and left as it
// was; a symlink is written through (the link stays, its target gets the new
// bytes); a stale temporary is replaced, never followed.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "checkpoint/file_util.hpp"
#include "nvfp4moe/checkpoint.hpp"
#include "nvfp4moe/moe.hpp"
#include "support/moe_test_util.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe {
namespace {

using test::read_bytes;
using test::ScratchDir;
using test::is_char_device;
using test::is_link;
using test::is_fifo;

std::string text(const std::string& p) {
  const std::vector<uint8_t> b = read_bytes(p);
  return std::string(b.begin(), b.end());
}

// One writer under test: writes something to `path`.
struct Writer {
  const char* label;
  void (*write)(const std::string& path);
};

void write_text_file(const std::string& path) { fileio::write_file_atomic(path, "new bytes"); }
void write_safetensors(const std::string& path) {
  const float x[2] = {1, 2};
  SafetensorsWriter w;
  w.add("x", DType::F32, {2}, x);
  w.write(path);
}

const Writer kWriters[] = {{"write_file_atomic", write_text_file}, {"SafetensorsWriter::write", write_safetensors}};

TEST(OutputPaths, SpecialFilesAreRefusedAndKept) {
  for (const Writer& w : kWriters) {
    SCOPED_TRACE(w.label);
    ScratchDir d;
    ASSERT_EQ(::mkfifo((d / "fifo").c_str(), 0600), 0);
    EXPECT_ERROR_CONTAINS(w.write(d / "fifo"), d / "fifo", "is a FIFO, not a regular file");
    EXPECT_TRUE(is_fifo(d / "fifo"));
    // A character device, reached through a symlink (a test must never risk
    // replacing /dev/null itself).
    std::filesystem::create_symlink("/dev/null", d / "null");
    EXPECT_ERROR_CONTAINS(w.write(d / "null"), "(a symlink to /dev/null) is a character device");
    EXPECT_TRUE(is_link(d / "null"));
    EXPECT_TRUE(is_char_device("/dev/null"));
    std::filesystem::create_directory(d / "dir");
    EXPECT_ERROR_CONTAINS(w.write(d / "dir"), "is a directory, not a regular file");
    EXPECT_TRUE(std::filesystem::is_directory(d / "dir"));
    // A symlink loop.
    std::filesystem::create_symlink("loop2", d / "loop1");
    std::filesystem::create_symlink("loop1", d / "loop2");
    EXPECT_ERROR_CONTAINS(w.write(d / "loop1"), "too many levels of symbolic links");
    // No temporary left anywhere.
    int entries = 0;
    for (const auto& e : std::filesystem::directory_iterator(d.path())) entries += 1, (void)e;
    EXPECT_EQ(entries, 5);
  }
}

TEST(OutputPaths, SymlinksAreWrittenThroughToTheirTarget) {
  for (const Writer& w : kWriters) {
    SCOPED_TRACE(w.label);
    ScratchDir d;
    std::filesystem::create_directory(d / "sub");
    test::write_text(d / "sub/target", "old");
    std::filesystem::create_symlink("sub/target", d / "link");  // relative to the link's directory
    std::filesystem::create_symlink("link", d / "link2");       // a chain
    w.write(d / "link2");
    EXPECT_TRUE(is_link(d / "link"));
    EXPECT_TRUE(is_link(d / "link2"));
    EXPECT_NE(text(d / "sub/target"), "old");
    const std::string written = text(d / "sub/target");
    w.write(d / "plain");
    EXPECT_EQ(text(d / "plain"), written);  // the same bytes as a plain write
    // A dangling symlink: its target is created.
    std::filesystem::create_symlink(d / "sub/new", d / "dangling");
    w.write(d / "dangling");
    EXPECT_EQ(text(d / "sub/new"), written);
    EXPECT_TRUE(is_link(d / "dangling"));
  }
}

TEST(OutputPaths, AStaleTemporaryIsReplacedNotFollowed) {
  for (const Writer& w : kWriters) {
    SCOPED_TRACE(w.label);
    ScratchDir d;
    test::write_text(d / "victim", "victim");
    std::filesystem::create_symlink(d / "victim", fileio::temp_name(d / "out"));
    w.write(d / "out");
    EXPECT_EQ(text(d / "victim"), "victim");
    EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(fileio::temp_name(d / "out"))));
  }
}

TEST(OutputPaths, SameFileAndInputChecks) {
  ScratchDir d;
  test::write_text(d / "a", "a");
  std::filesystem::create_hard_link(d / "a", d / "hard");
  std::filesystem::create_symlink("a", d / "soft");
  std::filesystem::create_directory(d / "model");
  test::write_text(d / "model/model.safetensors", "m");
  EXPECT_TRUE(fileio::same_file(d / "a", d / "hard"));
  EXPECT_TRUE(fileio::same_file(d / "a", d / "soft"));
  EXPECT_FALSE(fileio::same_file(d / "a", d / "model/model.safetensors"));
  EXPECT_FALSE(fileio::same_file(d / "a", d / "absent"));
  EXPECT_ERROR_CONTAINS(fileio::check_not_input(d / "hard", "--output", d / "a", "--input"),
                        "--output " + (d / "hard") + " is the same file as --input " + (d / "a"));
  EXPECT_ERROR_CONTAINS(fileio::check_not_input(d / "model/model.safetensors", "--output", d / "model", "--model"),
                        "is the file " + (d / "model/model.safetensors") + " of --model");
  EXPECT_NO_THROW(fileio::check_not_input(d / "new", "--output", d / "model", "--model"));
  std::filesystem::create_directory(d / "model/inference");
  test::write_text(d / "model/inference/config.json", "{}");
  EXPECT_ERROR_CONTAINS(fileio::check_not_input(d / "model/inference/config.json", "--output", d / "model", "--model"),
                        "is the file " + (d / "model/inference/config.json"));
  EXPECT_ERROR_CONTAINS(fileio::output_directory_target(d / "x.safetensors"), "the name ends in .safetensors");
  EXPECT_ERROR_CONTAINS(fileio::output_directory_target(d / "x.safetensors/"), "the name ends in .safetensors");
  EXPECT_ERROR_CONTAINS(fileio::output_directory_target(d / "a"), "is a regular file, not a directory");
  EXPECT_EQ(fileio::output_directory_target(d / "model"), d / "model");
}

TEST(OutputPaths, SaveMoeLayerChecksEveryOutputBeforeWriting) {
  const MoeWeights w = make_synthetic_moe(test::small_config(32, 32, 4, 2), 5);
  ScratchDir d;
  EXPECT_ERROR_CONTAINS(save_moe_layer(d / "layer.safetensors", 0, w), "the name ends in .safetensors");
  EXPECT_FALSE(std::filesystem::exists(d / "layer.safetensors"));
  test::write_text(d / "file", "f");
  EXPECT_ERROR_CONTAINS(save_moe_layer(d / "file", 0, w), "is a regular file, not a directory");
  // config.json a FIFO: refused before model.safetensors is written.
  std::filesystem::create_directory(d / "m");
  ASSERT_EQ(::mkfifo((d / "m/config.json").c_str(), 0600), 0);
  EXPECT_ERROR_CONTAINS(save_moe_layer(d / "m", 0, w), "config.json is a FIFO, not a regular file");
  EXPECT_FALSE(std::filesystem::exists(d / "m/model.safetensors"));
  EXPECT_TRUE(is_fifo(d / "m/config.json"));
}

}  // namespace
}  // namespace nvfp4moe
