// grouped_gemm_ref: the reference grouped NVFP4 x BF16 GEMM (the contract is
// GroupedGemmPlan, layout/grouped_gemm_plan.hpp) on weights in the tile layout
// (layout/tile_layout.hpp). "Swap AB": the weights are the 16-row operand of
// mma.m16n8k16, tokens the 8-column one. Also the kernel for shapes the
// fragment layout does not take (K % 128 != 0 or I % 8 != 0).
#pragma once

#include <cuda_runtime.h>

#include "cuda/layout/grouped_gemm_plan.hpp"
#include "cuda/layout/tile_layout.hpp"

namespace nvfp4moe::cuda {

void grouped_gemm_ref(const GroupedGemmPlan& plan, cudaStream_t stream);

}  // namespace nvfp4moe::cuda
