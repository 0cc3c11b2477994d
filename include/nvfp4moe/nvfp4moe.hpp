// nvfp4moe — NVFP4 Mixture-of-Experts for Hopper. The umbrella header.
#pragma once

#include "nvfp4moe/checkpoint.hpp"  // safetensors, model directories, ModelOpt NVFP4 layers
#include "nvfp4moe/ep.hpp"          // expert parallelism on the CPU (R logical ranks)
#include "nvfp4moe/ep_cuda.hpp"     // expert parallelism on GPUs (NCCL symmetric memory, emulation)
#include "nvfp4moe/error.hpp"       // nvfp4moe::Error, NVFP4_CHECK
#include "nvfp4moe/format.hpp"      // codecs, quantization, scale layouts
#include "nvfp4moe/moe.hpp"         // MoeConfig, MoeWeights, Moe (cpu / cuda backends)
#include "nvfp4moe/types.hpp"       // DType, Bf16, TensorView
