// nvfp4moe — command-line entry point: dispatches to a subcommand and turns
// every nvfp4moe::Error into a message and exit code 1.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "cli/commands.hpp"
#include "nvfp4moe/error.hpp"

namespace {

struct Command {
  const char* name;
  int (*run)(int, char**);
  const char* help;
};

const Command kCommands[] = {
    {"demo", nvfp4moe::cli::cmd_demo, "run a synthetic DeepSeek-V4 NVFP4 MoE layer (the main job)"},
    {"run", nvfp4moe::cli::cmd_run, "run one MoE layer of a model directory on inputs from a file"},
    {"quantize", nvfp4moe::cli::cmd_quantize, "quantize expert weights to ModelOpt NVFP4"},
    {"dequantize", nvfp4moe::cli::cmd_dequantize, "NVFP4 tensors back to BF16"},
    {"convert", nvfp4moe::cli::cmd_convert, "DeepSeek's MXFP4 release to ModelOpt NVFP4 experts"},
    {"inspect", nvfp4moe::cli::cmd_inspect, "list tensors, quantization and MoE config"},
    {"bench", nvfp4moe::cli::cmd_bench, "time the MoE forward against its roofline"},
};

void usage(FILE* f) {
  std::fprintf(f, "usage: nvfp4moe <command> [options]   (nvfp4moe <command> --help)\n\ncommands:\n");
  for (const auto& c : kCommands) std::fprintf(f, "  %-11s %s\n", c.name, c.help);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || !std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (const auto& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    try {
      return c.run(argc - 2, argv + 2);
    } catch (const nvfp4moe::Error& e) {
      std::fprintf(stderr, "nvfp4moe %s: error: %s\n", c.name, e.what());
      return 1;
    } catch (const std::exception& e) {
      std::fprintf(stderr, "nvfp4moe %s: error: %s\n", c.name, e.what());
      return 1;
    }
  }
  std::fprintf(stderr, "nvfp4moe: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
