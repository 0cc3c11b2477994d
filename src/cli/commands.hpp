// The subcommands of the `nvfp4moe` tool; each lives in its own cmd_*.cpp and
// receives the arguments after its name. Return the process exit code.
#pragma once

#include <vector>

#include "cli/args.hpp"

namespace nvfp4moe::cli {

int cmd_demo(int argc, char** argv);        // cmd_demo.cpp: the main job
int cmd_run(int argc, char** argv);         // cmd_run.cpp
int cmd_quantize(int argc, char** argv);    // cmd_quantize.cpp
int cmd_dequantize(int argc, char** argv);  // cmd_quantize.cpp
int cmd_inspect(int argc, char** argv);     // cmd_inspect.cpp
int cmd_bench(int argc, char** argv);       // cmd_bench.cpp
int cmd_convert(int argc, char** argv);     // cmd_convert.cpp
// --ep R on GPUs (one process per GPU over NCCL): cmd_ep_cuda.cpp
int cmd_bench_ep_cuda(int argc, char** argv);
int cmd_run_ep_cuda(int argc, char** argv);
// The options of `run`, with or without --ep (cmd_run.cpp).
std::vector<Option> run_options();

}  // namespace nvfp4moe::cli
