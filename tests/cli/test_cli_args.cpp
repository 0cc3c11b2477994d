// The one argument parser (cli/args.hpp): each rule on its own, then the same
// rules through every command of the built tool, so no command can drift
// from them (run and demo once disagreed on --threads -1).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "checkpoint/checkpoint_files.hpp"
#include "cli/args.hpp"
#include "support/test_util.hpp"

namespace nvfp4moe::cli {
namespace {

// argv storage for one parse.
struct Argv {
  explicit Argv(std::vector<std::string> a) : strings(std::move(a)) {
    for (auto& s : strings) ptrs.push_back(s.data());
  }
  int argc() { return int(ptrs.size()); }
  char** argv() { return ptrs.data(); }
  std::vector<std::string> strings;
  std::vector<char*> ptrs;
};

std::vector<Option> table() {
  return {flag("help"), text("model"), integer("threads", 1, kMaxThreads), int_list("tokens", 1, 100),
          choice("device", {"cpu", "cuda"})};
}

Args parse(std::vector<std::string> a, size_t positional = 0) {
  Argv v(std::move(a));
  return Args(v.argc(), v.argv(), table(), positional);
}

TEST(CliArgs, ParsesEveryKindBothSpellings) {
  const Args a = parse({"--model", "m", "--threads=8", "--tokens", "1,8,64", "--device=cuda", "--help", "p"}, 1);
  EXPECT_TRUE(a.has("help"));
  EXPECT_EQ(a.get("model", ""), "m");
  EXPECT_EQ(a.get_int("threads", 0), 8);
  EXPECT_EQ(a.get_int_list("tokens", "5"), (std::vector<int64_t>{1, 8, 64}));
  EXPECT_EQ(a.get("device", "cpu"), "cuda");
  EXPECT_EQ(a.positional(), (std::vector<std::string>{"p"}));
  const Args d = parse({});
  EXPECT_FALSE(d.has("help"));
  EXPECT_EQ(d.get_int("threads", 0), 0);  // the command's fallback when absent
  EXPECT_EQ(d.get_int_list("tokens", "5,6"), (std::vector<int64_t>{5, 6}));
  EXPECT_EQ(d.value("model"), std::nullopt);
  EXPECT_EQ(parse({"--model=--odd"}).get("model", ""), "--odd");  // '=' allows a leading --
}

TEST(CliArgs, EveryRuleFailsNamingTheOptionAndValue) {
  struct Bad {
    std::vector<std::string> args;
    std::string message;
  };
  const Bad bad[] = {
      {{"--bogus", "1"}, "unknown option --bogus (this command takes --device, --help, --model, --threads, --tokens)"},
      {{"--threads", "2", "--threads", "3"}, "option --threads is given twice"},
      {{"--help", "--help"}, "option --help is given twice"},
      {{"--threads"}, "option --threads needs a value"},
      {{"--model", "--threads", "2"}, "option --model needs a value, got the option '--threads'"},
      {{"--help=yes"}, "option --help is a flag and takes no value, got 'yes'"},
      {{"--threads", "-1"}, "--threads: -1 is out of range [1, 1024]"},
      {{"--threads", "0"}, "--threads: 0 is out of range [1, 1024]"},
      {{"--threads", "4294967297"}, "--threads: 4294967297 is out of range [1, 1024]"},
      {{"--threads", "99999999999999"}, "--threads: 99999999999999 is out of range [1, 1024]"},
      {{"--threads", "8x"}, "--threads: '8x' is not an integer"},
      {{"--threads="}, "--threads: '' is not an integer"},
      {{"--tokens", "1,,2"}, "--tokens item: '' is not an integer"},
      {{"--tokens", "1,200"}, "--tokens item: 200 is out of range [1, 100]"},
      {{"--device", "gpu"}, "--device: 'gpu' is not one of cpu, cuda"},
      {{"stray"}, "unexpected argument 'stray' (the command takes at most 0)"},
      {{"-h"}, "unknown option '-h' (options start with --)"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.message);
    EXPECT_ERROR_CONTAINS(parse(b.args), b.message);
  }
  EXPECT_ERROR_CONTAINS(parse({"a", "b"}, 1), "unexpected argument 'b' (the command takes at most 1)");
  // A long value is abbreviated in the message.
  EXPECT_ERROR_CONTAINS(parse({"--threads", std::string(100000, '9')}), "(100000 characters) is out of range");
}

TEST(CliArgs, MisuseByACommandIsReportedAsADefect) {
  const Args a = parse({});
  EXPECT_ERROR_CONTAINS(a.has("nope"), "internal: option --nope is not declared");
  EXPECT_ERROR_CONTAINS(a.get_int("model", 0), "internal: option --model is a text option, read as an integer");
  EXPECT_ERROR_CONTAINS(a.require("model"), "missing required option --model");
  EXPECT_ERROR_CONTAINS(a.require_int("threads"), "missing required option --threads (an integer in [1, 1024])");
}

TEST(CliArgs, Mentions) {
  Argv v({"--tokens", "1", "--ep=2"});
  EXPECT_TRUE(mentions(v.argc(), v.argv(), "ep"));
  EXPECT_TRUE(mentions(v.argc(), v.argv(), "tokens"));
  EXPECT_FALSE(mentions(v.argc(), v.argv(), "e"));
  EXPECT_FALSE(mentions(v.argc(), v.argv(), "help"));
}

struct ToolResult {
  int code = -1;
  std::string err;
};

ToolResult run_tool(const std::string& args) {
  test::ScratchDir logs;
  const std::string cmd = std::string(NVFP4MOE_CLI_PATH) + " " + args + " >/dev/null 2>" + (logs / "err");
  const int status = std::system(cmd.c_str());
  const std::vector<uint8_t> b = test::read_bytes(logs / "err");
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, std::string(b.begin(), b.end())};
}

// Every command refuses the same mistakes, before touching any file.
TEST(CliArgs, EveryCommandAppliesTheSameRules) {
  for (const char* cmd : {"demo", "run", "quantize", "dequantize", "inspect", "bench"}) {
    SCOPED_TRACE(cmd);
    ToolResult r = run_tool(std::string(cmd) + " --bogus 1");
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("unknown option --bogus"), std::string::npos) << r.err;
    r = run_tool(std::string(cmd) + (std::string(cmd) == "inspect" ? " p q" : " stray"));
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("unexpected argument '"), std::string::npos) << r.err;
  }
  for (const char* cmd : {"demo", "run"}) {
    SCOPED_TRACE(cmd);
    for (const char* v : {"-1", "0", "99999999999999", "4294967297"}) {
      const ToolResult r = run_tool(std::string(cmd) + " --threads " + v);
      EXPECT_EQ(r.code, 1);
      EXPECT_NE(r.err.find(std::string("--threads: ") + v + " is out of range [1, 1024]"), std::string::npos) << r.err;
    }
    const ToolResult r = run_tool(std::string(cmd) + " --threads 2 --threads 2");
    EXPECT_NE(r.err.find("option --threads is given twice"), std::string::npos) << r.err;
  }
  for (const char* a : {"run --layer -1", "run --layer 4294967297", "inspect x --layer 99999999999999999999"}) {
    SCOPED_TRACE(a);
    const ToolResult r = run_tool(a);
    EXPECT_EQ(r.code, 1);
    EXPECT_NE(r.err.find("--layer: "), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("is out of range [0, 65535]"), std::string::npos) << r.err;
  }
  ToolResult r = run_tool("demo --seed -1");
  EXPECT_NE(r.err.find("--seed: -1 is out of range [0, 9223372036854775807]"), std::string::npos) << r.err;
  r = run_tool("demo --tokens 8,0");
  EXPECT_NE(r.err.find("--tokens item: 0 is out of range [1, 16777216]"), std::string::npos) << r.err;
  r = run_tool("run --ep 0");
  EXPECT_NE(r.err.find("--ep: 0 is out of range [1, 64]"), std::string::npos) << r.err;
  r = run_tool("bench --shared fp16");  // parsed before the device is looked for
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--shared: 'fp16' is not one of bf16, fp8"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nvfp4moe::cli
