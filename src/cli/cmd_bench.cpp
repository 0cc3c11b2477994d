// Placeholder until this subcommand lands.
#include <cstdio>

#include "cli/commands.hpp"

namespace nvfp4moe::cli {
int cmd_bench(int, char**) { std::fprintf(stderr, "not implemented yet\n"); return 2; }

}  // namespace nvfp4moe::cli
